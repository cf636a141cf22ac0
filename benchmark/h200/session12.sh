#!/usr/bin/env bash
# 2026-12-02, session 12's H200 calls on issue 27, each part a call, carry
# [".whl", ".dev/smol-tok", ".dev/old"] every time:
#   probe   decode at batch 1 (where a step's time goes: GPU span, busy, long gaps, kernels);
#           the official workload, three rounds, page_size 256 (the official's) against 16;
#           the GPU tests of chapters 18 and 19 on this tree.
#   Then one warm machine, three calls in a row (SmolLM2's wheel travels in three parts, one a
#   call, as in session6.sh), after the PDL change:
#   stage    carry also .dev/smollm2-1: the GEMV alone and decode at batch 1 and at batch 256
#            (page_size 256, temperature 0.6), this tree with and without PDL (MINISGL_PDL=0)
#            and .dev/old's tree (before this session).
#   measure  carry .dev/smollm2-2: the official workload, three rounds each: this tree, this
#            tree with MINISGL_PDL=0, .dev/old's tree.
#   tests    carry .dev/smollm2-3: SmolLM2 and the tiny checkpoints built here, then the GPU
#            tests of every chapter on this tree; the roofline's per-step record.
#   ablate   carry [".whl", ".dev/smol-tok"], a fresh machine: chapter 21's ablation table (one
#            round each, transformers last) on this tree, then its timeline at batch 256.
# Before the first call, here:  rm -rf .dev/old && mkdir -p .dev/old &&
#   git archive BEFORE python steps benchmark tools | tar -x -C .dev/old
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session12.sh probe|stage|measure|tests|ablate}
source benchmark/h200/setup.sh
R=$OUT/s12-$part && mkdir -p $R
M=models/qwen3-0.6b-random
export PYTHONPATH=python:$PYTHONPATH  # the benchmarks import minisgl from this tree
OLD=.dev/old/python:$PYTHONPATH
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
stage)
    host_speed > $R/host.txt 2>&1
    timeout 60 python3 benchmark/h200/gemv_bench.py > $R/gemv_bench_after.txt 2>&1
    MINISGL_PDL=0 timeout 40 python3 benchmark/h200/gemv_bench.py > $R/gemv_bench_nopdl.txt 2>&1
    PYTHONPATH=$OLD timeout 60 python3 .dev/old/benchmark/h200/gemv_bench.py \
        > $R/gemv_bench_before.txt 2>&1
    tail -n 4 $R/gemv_bench_*.txt
    b1="--model $M --attn flashinfer --batch 1 --top 40"
    b256="--model $M --attn flashinfer --batch 256 --prompt-len 1024 --page-size 256 \
          --temperature 0.6 --top 30"
    timeout 100 python3 benchmark/decode_profile.py $b1 > $R/decode_b1_after.txt 2>&1
    MINISGL_PDL=0 timeout 60 python3 benchmark/decode_profile.py $b1 > $R/decode_b1_nopdl.txt 2>&1
    PYTHONPATH=$OLD timeout 60 python3 .dev/old/benchmark/decode_profile.py $b1 \
        > $R/decode_b1_before.txt 2>&1
    timeout 80 python3 benchmark/decode_profile.py $b256 > $R/decode_b256_after.txt 2>&1
    MINISGL_PDL=0 timeout 80 python3 benchmark/decode_profile.py $b256 \
        > $R/decode_b256_nopdl.txt 2>&1
    grep -A2 "^decode" $R/decode_b*.txt ;;
measure)
    args="--device cuda --model $M --attn flashinfer --rounds 3 --skip-transformers"
    timeout 150 python3 benchmark/offline.py $args --json $R/offline_after.json \
        > $R/offline_after.txt 2>&1
    MINISGL_PDL=0 timeout 150 python3 benchmark/offline.py $args --json $R/offline_nopdl.json \
        > $R/offline_nopdl.txt 2>&1
    PYTHONPATH=$OLD timeout 150 python3 .dev/old/benchmark/offline.py $args \
        --json $R/offline_before.json > $R/offline_before.txt 2>&1
    tail -n 3 $R/offline_*.txt ;;
tests)
    smollm2_from_parts $R/models.txt
    tail -n 3 $R/models.txt
    timeout 330 python3 -m pytest -q -rs tests/test_cuda_kernels_cuda.py \
        tests/test_cuda_graph_cuda.py tests/test_gpu_attention_cuda.py tests/test_fused_moe_cuda.py \
        > $R/pytest_gpu.txt 2>&1
    tail -n 15 $R/pytest_gpu.txt
    timeout 100 python3 benchmark/roofline.py --device cuda --model $M --workload official \
        --json $R/roofline.json > $R/roofline.txt 2>&1
    tail -n 9 $R/roofline.txt ;;
ablate)
    timeout 440 python3 benchmark/offline.py --device cuda --model $M --attn flashinfer \
        --ablate overlap cuda-graph custom-kernels radix page-16 --json $R/offline.json \
        --plot $R/offline.png > $R/offline.txt 2>&1
    tail -n 12 $R/offline.txt
    timeout 60 python3 benchmark/timeline.py --device cuda --model $M --batch 256 \
        --json $R/timeline.json --plot $R/timeline.png > $R/timeline.txt 2>&1
    tail -n 6 $R/timeline.txt ;;
esac
