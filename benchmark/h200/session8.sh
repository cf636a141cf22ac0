#!/usr/bin/env bash
# 2026-12-02, session 9's H200 calls (each on a cold machine, carry [".whl", ".dev/smol-tok"]):
#   serving  the serving floors of issue 26 as the median of three runs of one command on one
#            machine, each side by side with LLM.generate on the same requests (--compare-offline),
#            at 16 req/s (the TTFT floor) and at rate inf (throughput and ITL); first a fixed
#            pure-Python loop, so that runs on different lent machines compare by host speed.
#   kernels  chapter 20's open question (one MoE layer at 1 token, kernel by kernel:
#            moe_bench --profile); FlashInfer's decode attention with and without tensor cores
#            on Qwen3-0.6B's shapes (decode_attention.py); a short server run on the GPU.
set -uo pipefail
part=${1:?usage: session8.sh serving|kernels}
source benchmark/h200/setup.sh
R=/tmp/s8-$part && mkdir -p $R
M=models/qwen3-0.6b-random
W="--device cuda --model $M --num-requests 400 --input-len 1024 --output-len 256"
case $part in
serving)
    host_speed > $R/host.txt 2>&1
    for i in 1 2 3; do
        timeout 180 python3 benchmark/online.py $W --rates 16 inf --compare-offline \
            --json $R/run$i.json > $R/run$i.txt 2>&1
    done
    summary() { cat $R/host.txt; grep -h -A4 "^下限" $R/run*.txt; } ;;
kernels)
    export PYTHONPATH=python:$PYTHONPATH  # moe_bench imports minisgl's timing helper
    timeout 120 python3 benchmark/moe_bench.py --tokens 1 --profile > $R/moe_profile.txt 2>&1
    timeout 150 python3 benchmark/h200/decode_attention.py > $R/decode_attention.txt 2>&1
    timeout 150 python3 benchmark/online.py --device cuda --model $M --num-requests 64 \
        --rates inf > $R/server.txt 2>&1
    summary() { tail -n 20 $R/moe_profile.txt; cat $R/decode_attention.txt; tail -n 8 $R/server.txt; } ;;
esac
tar czf $OUT/session8-$part.tgz -C /tmp s8-$part
summary
