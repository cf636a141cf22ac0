#!/usr/bin/env bash
# What the sessions before could not reach (issues of stage 4, next to the numbers they leave),
# in parts of under 10 minutes each, one call each on one warm machine (the mains of chapters
# 18-20, first run from here, are session6.sh's `mains` part: SmolLM2's wheel needs three calls):
#   offline  the three attention backends on the official offline workload, and the decode
#            profile at batch 1 and 256 that the next speed work starts from;
#   serving  the serving ITL against the prefill budget per step (#26's missed floor).
set -uo pipefail
part=${1:?usage: session5.sh offline|serving}
source benchmark/h200/setup.sh
R=/tmp/s5-$part && mkdir -p $R  # every record here, one archive at the end ($OUT takes few files)
M=models/qwen3-0.6b-random
case $part in
offline)
    export PYTHONPATH=python:$PYTHONPATH
    timeout 330 python3 benchmark/offline.py --device cuda --model $M \
        --attn flashinfer fa torch --skip-transformers > $R/offline_backends.txt 2>&1
    for bs in 1 256; do
        timeout 100 python3 benchmark/decode_profile.py --model $M --attn flashinfer \
            --batch $bs --top 25 > $R/decode_profile_b$bs.txt 2>&1
    done ;;
serving)
    # Newly admitted requests' prefill steps stall every decoding one: a smaller prefill
    # budget per step trades TTFT for ITL. Same requests, one server each.
    W="--device cuda --model $M --num-requests 400 --input-len 1024 --output-len 256 --rates inf"
    for budget in 8192 2048 1024; do
        timeout 170 python3 benchmark/online.py $W --compare-offline \
            --server-args "--max-prefill-length $budget" --json $R/online-prefill$budget.json \
            > $R/online-prefill$budget.txt 2>&1
    done ;;
esac
tar czf $OUT/session5-$part.tgz -C /tmp s5-$part
tail -n 4 $R/*.txt
