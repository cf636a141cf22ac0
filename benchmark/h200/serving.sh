#!/usr/bin/env bash
# Where a streamed token's time goes, before and after this session's server changes: the same
# 400 requests (prompts 512-1024, outputs 128-256) at rate inf and 16/s, every server process
# sampled by py-spy, the scheduler's own counters; then LLM.generate on the same requests.
set -uo pipefail
source benchmark/h200/setup.sh
M=models/qwen3-0.6b-random
W="--device cuda --model $M --num-requests 400 --input-len 1024 --output-len 256 --rates inf 16"
python3 benchmark/online.py $W --engine-path .dev/old/python --profile /tmp/prof-before \
    --json $OUT/online-before.json > $OUT/online-before.txt 2>&1
python3 benchmark/online.py $W --profile /tmp/prof-after --compare-offline \
    --json $OUT/online-after.json > $OUT/online-after.txt 2>&1
tar czf $OUT/profiles.tgz -C /tmp prof-before prof-after
tail -n 60 $OUT/online-before.txt $OUT/online-after.txt
