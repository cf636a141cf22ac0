#!/usr/bin/env bash
# The last H200 call of the serving work, each part bounded so the call ends in time:
# 1. the server before (the previous commit's tree) and after, same 400 requests at rate inf
#    and 16/s, four client processes; after: py-spy profiles and LLM.generate on the same
#    requests, with the floors printed;
# 2. the shared-prefix workload, radix against naive (chapter 21);
# 3. the official offline workload with each attention backend in one run (chapter 21);
# 4. the two clients' cost per chunk on this host, the kernel bench with its copy row.
set -uo pipefail
source benchmark/h200/setup.sh
M=models/qwen3-0.6b-random
W="--device cuda --model $M --num-requests 400 --input-len 1024 --output-len 256 --rates inf 16"
timeout 200 python3 benchmark/online.py $W --engine-path .dev/old/python \
    --json $OUT/online-before.json > $OUT/online-before.txt 2>&1
timeout 170 python3 benchmark/online.py $W --profile /tmp/prof --compare-offline \
    --json $OUT/online-after.json > $OUT/online-after.txt 2>&1
tar czf $OUT/profiles3.tgz -C /tmp prof
timeout 100 python3 benchmark/online.py --device cuda --model $M --workload shared-prefix \
    --compare-cache --num-users 32 --turns 3 --rates inf > $OUT/shared-prefix.txt 2>&1
export PYTHONPATH=python:$PYTHONPATH
{ timeout 90 python3 benchmark/offline.py --device cuda --model $M --attn flashinfer fa torch \
    --skip-transformers; timeout 20 python3 benchmark/client_cost.py;
  timeout 40 python3 benchmark/kernel_bench.py; } > $OUT/chapter21.txt 2>&1
grep -v "py-spy\|capturing" $OUT/online-before.txt | tail -n 12
grep -v "capturing" $OUT/online-after.txt | grep -v "^    " | tail -n 40
tail -n 8 $OUT/shared-prefix.txt; grep -v capturing $OUT/chapter21.txt | tail -n 40
