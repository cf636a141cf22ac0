#!/usr/bin/env bash
# 2026-12-02, session 11's H200 calls on issue 27 (the official workload's speed), each part a
# call, carry [".whl", ".dev/smol-tok", ".dev/old"] every time:
#   profile  (run at a38efe4) where the time goes: decode at batch 256 (prompts of 1,024,
#            page_size 256, temperature 0.6 as the official workload samples) with chapter 19's
#            kernels on and off, the sampler apart; the whole official workload under py-spy
#            and under the profiler (workload_profile.py); the roofline's per-step record.
#   kernels  chapter 19's GEMV against cuBLAS on Qwen3-0.6B's projections at 1-4 rows; decode
#            at batch 1 with chapter 19's kernels on and off, and at batch 256 (as in profile).
#   offline  the official workload, three rounds, this tree and .dev/old's (each its own
#            offline.py); then the roofline's per-step record of this tree.
#   all      when machines are scarce: offline's two runs, then decode at batch 1 and the GEMV
#            bench, in one call.
# Before the first call, here:  rm -rf .dev/old && mkdir -p .dev/old &&
#   git archive BEFORE python steps benchmark tools | tar -x -C .dev/old
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session11.sh profile|kernels|offline|all}
source benchmark/h200/setup.sh
R=$OUT/s11-$part && mkdir -p $R
M=models/qwen3-0.6b-random
export PYTHONPATH=python:$PYTHONPATH  # the benchmarks import minisgl from this tree
case $part in
profile)
    host_speed > $R/host.txt 2>&1
    timeout 200 python3 benchmark/decode_profile.py --model $M --attn flashinfer --batch 256 \
        --prompt-len 1024 --page-size 256 --temperature 0.6 --custom-kernels auto off --top 30 \
        > $R/decode_b256.txt 2>&1
    timeout 200 python3 benchmark/h200/workload_profile.py --model $M --out $R \
        > $R/workload.txt 2>&1
    timeout 120 python3 benchmark/roofline.py --device cuda --model $M --workload official \
        --json $R/roofline.json > $R/roofline.txt 2>&1
    cat $R/host.txt $R/decode_b256.txt; head -c 6000 $R/workload.txt; tail -n 12 $R/roofline.txt ;;
kernels)
    host_speed > $R/host.txt 2>&1
    timeout 100 python3 benchmark/h200/gemv_bench.py > $R/gemv_bench.txt 2>&1
    timeout 150 python3 benchmark/decode_profile.py --model $M --attn flashinfer --batch 1 \
        --custom-kernels auto off --top 40 > $R/decode_b1.txt 2>&1
    timeout 150 python3 benchmark/decode_profile.py --model $M --attn flashinfer --batch 256 \
        --prompt-len 1024 --page-size 256 --temperature 0.6 --top 30 > $R/decode_b256.txt 2>&1
    cat $R/host.txt $R/gemv_bench.txt; grep -A3 "^decode" $R/decode_b*.txt ;;
offline|all)
    timeout 200 python3 benchmark/offline.py --device cuda --model $M --attn flashinfer \
        --rounds 3 --skip-transformers --json $R/offline_after.json > $R/offline_after.txt 2>&1
    PYTHONPATH=.dev/old/python:$PYTHONPATH timeout 130 python3 .dev/old/benchmark/offline.py \
        --device cuda --model $M --attn flashinfer --rounds 3 --skip-transformers \
        --json $R/offline_before.json > $R/offline_before.txt 2>&1
    tail -n 4 $R/offline_*.txt
    if [ $part = all ]; then
        timeout 70 python3 benchmark/decode_profile.py --model $M --attn flashinfer --batch 1 \
            --custom-kernels auto off --top 40 > $R/decode_b1.txt 2>&1
        timeout 50 python3 benchmark/h200/gemv_bench.py > $R/gemv_bench.txt 2>&1
        cat $R/gemv_bench.txt; grep -A3 "^decode" $R/decode_b1.txt
    else
        timeout 120 python3 benchmark/roofline.py --device cuda --model $M --workload official \
            --json $R/roofline.json > $R/roofline.txt 2>&1
        tail -n 9 $R/roofline.txt
    fi ;;
esac
