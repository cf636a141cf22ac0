#!/usr/bin/env bash
# 2026-12-02, the second H200 call of session 9 (one call, about 8 minutes on a cold machine):
# the serving floors of issue 26 as the median of three runs of the same command on one machine,
# each run side by side with LLM.generate on the same requests (--compare-offline), at 16 req/s
# (the TTFT floor) and at rate inf (the throughput and ITL floors); a fixed pure-Python loop
# first, so that runs on different lent machines can be compared by their host's speed; then
# chapter 20's open question: one MoE layer at 1 token, kernel by kernel (moe_bench --profile).
# carry [".whl", ".dev/smol-tok"]
set -uo pipefail
source benchmark/h200/setup.sh
R=/tmp/s8 && mkdir -p $R
M=models/qwen3-0.6b-random
{
    lscpu | grep -E "^(Model name|CPU\(s\)|CPU MHz|L3 cache)"
    python3 -c "import time; t = time.perf_counter(); sum(i * i for i in range(10**7)); \
print(f'host speed: {time.perf_counter() - t:.2f} s for sum(i * i for i in range(10**7))')"
} > $R/host.txt 2>&1
for i in 1 2 3; do
    timeout 190 python3 benchmark/online.py --device cuda --model $M --num-requests 400 \
        --input-len 1024 --output-len 256 --rates 16 inf --compare-offline \
        --json $R/run$i.json > $R/run$i.txt 2>&1
done
timeout 90 python3 benchmark/moe_bench.py --tokens 1 --profile > $R/moe_profile.txt 2>&1
tar czf $OUT/session8.tgz -C /tmp s8
cat $R/host.txt; grep -h -A3 "^下限" $R/run*.txt; tail -n 25 $R/moe_profile.txt
