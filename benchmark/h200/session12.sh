#!/usr/bin/env bash
# 2026-12-02, session 12's H200 calls on issue 27, each part a call, carry
# [".whl", ".dev/smol-tok", ".dev/old"] every time:
#   probe   decode at batch 1 (where a step's time goes: GPU span, busy, long gaps, kernels);
#           the official workload, three rounds, page_size 256 (the official's) against 16;
#           the GPU tests of chapters 18 and 19 on this tree.
#   after   this tree against .dev/old's (the tree before this session): the GEMV alone, decode
#           at batch 1, the official workload three rounds each; then the roofline record.
# Before the first call, here:  rm -rf .dev/old && mkdir -p .dev/old &&
#   git archive BEFORE python steps benchmark tools | tar -x -C .dev/old
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session12.sh probe|after}
source benchmark/h200/setup.sh
R=$OUT/s12-$part && mkdir -p $R
M=models/qwen3-0.6b-random
export PYTHONPATH=python:$PYTHONPATH  # the benchmarks import minisgl from this tree
case $part in
probe)
    host_speed > $R/host.txt 2>&1
    timeout 150 python3 benchmark/decode_profile.py --model $M --attn flashinfer --batch 1 \
        --top 40 > $R/decode_b1.txt 2>&1
    head -n 4 $R/decode_b1.txt
    timeout 200 python3 benchmark/offline.py --device cuda --model $M --attn flashinfer \
        --rounds 3 --ablate page-16 --skip-transformers --json $R/offline_pages.json \
        > $R/offline_pages.txt 2>&1
    tail -n 4 $R/offline_pages.txt
    timeout 200 python3 -m pytest -q tests/test_cuda_kernels_cuda.py tests/test_cuda_graph_cuda.py \
        > $R/pytest_gpu.txt 2>&1
    tail -n 15 $R/pytest_gpu.txt ;;
after)
    host_speed > $R/host.txt 2>&1
    timeout 60 python3 benchmark/h200/gemv_bench.py > $R/gemv_bench_after.txt 2>&1
    PYTHONPATH=.dev/old/python:$PYTHONPATH timeout 60 python3 .dev/old/benchmark/h200/gemv_bench.py \
        > $R/gemv_bench_before.txt 2>&1
    timeout 100 python3 benchmark/decode_profile.py --model $M --attn flashinfer --batch 1 \
        --top 40 > $R/decode_b1_after.txt 2>&1
    PYTHONPATH=.dev/old/python:$PYTHONPATH timeout 100 python3 .dev/old/benchmark/decode_profile.py \
        --model $M --attn flashinfer --batch 1 --top 40 > $R/decode_b1_before.txt 2>&1
    head -n 4 $R/decode_b1_*.txt; cat $R/gemv_bench_*.txt
    timeout 130 python3 benchmark/offline.py --device cuda --model $M --attn flashinfer \
        --rounds 3 --skip-transformers --json $R/offline_after.json > $R/offline_after.txt 2>&1
    PYTHONPATH=.dev/old/python:$PYTHONPATH timeout 130 python3 .dev/old/benchmark/offline.py \
        --device cuda --model $M --attn flashinfer --rounds 3 --skip-transformers \
        --json $R/offline_before.json > $R/offline_before.txt 2>&1
    tail -n 4 $R/offline_*.txt ;;
esac
