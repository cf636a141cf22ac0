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
    httpcore httpx2 httpcore2 truststore certifi idna openai jiter distro py-spy
du -sh .whl
