#!/usr/bin/env bash
# The second H200 call of the serving work: the new server at rate inf profiled with its
# default PyTorch threads and with one (--server-threads 1), to see which threads burn the CPU
# of the scheduler process; then the official offline workload before/after.
set -uo pipefail
source benchmark/h200/setup.sh
M=models/qwen3-0.6b-random
W="--device cuda --model $M --num-requests 400 --input-len 1024 --output-len 256 --rates inf"
python3 benchmark/online.py $W --profile /tmp/prof-threads-default --compare-offline \
    --json $OUT/online-default.json > $OUT/online-default.txt 2>&1
python3 benchmark/online.py $W --profile /tmp/prof-threads-1 --server-threads 1 \
    > $OUT/online-threads1.txt 2>&1
tar czf $OUT/profiles2.tgz -C /tmp prof-threads-default prof-threads-1
O="--device cuda --model $M --attn flashinfer --ablate page-1 --skip-transformers"
PYTHONPATH=.dev/old/python:$PYTHONPATH python3 .dev/old/benchmark/offline.py $O \
    > $OUT/offline-before.txt 2>&1
PYTHONPATH=python:$PYTHONPATH python3 benchmark/offline.py $O > $OUT/offline-after.txt 2>&1
grep -v "py-spy\|capturing" $OUT/online-default.txt | tail -n 40
grep -v "capturing" $OUT/online-threads1.txt | tail -n 14
tail -n 8 $OUT/offline-before.txt $OUT/offline-after.txt
