#!/usr/bin/env bash
# The first H200 call of the serving work: serving before/after with profiles (serving.sh),
# then the official offline workload before/after at page_size 256 and 1 (the server's
# default), which shows what the per-step page-index work costs at each.
set -uo pipefail
source benchmark/h200/setup.sh
bash benchmark/h200/serving.sh
M=models/qwen3-0.6b-random
O="--device cuda --model $M --attn flashinfer --ablate page-1 --skip-transformers"
python3 .dev/old/benchmark/offline.py $O > $OUT/offline-before.txt 2>&1
python3 benchmark/offline.py $O > $OUT/offline-after.txt 2>&1
tail -n 12 $OUT/offline-before.txt $OUT/offline-after.txt
