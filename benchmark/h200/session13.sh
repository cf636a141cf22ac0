#!/usr/bin/env bash
# 2026-12-02, session 13's H200 calls on issue 27, each part a call, carry
# [".whl", ".dev/smol-tok", ".dev/old"] every time:
#   probe   the gated GEMV (ch19, session 12, not yet run on a GPU): gemv_bench.py's gated row,
#           decode at batch 1 on this tree and on .dev/old's (d1c15ee: PDL, no gated GEMV), in
#           turn; then FlashInfer's small-batch decode attention as the engine replays it
#           (decode_attention.py --graph), with and without its tensor-core path and fixed
#           chunk sizes.
#   Then one warm machine, three calls in a row (SmolLM2's wheel travels in three parts, one a
#   call, as in session12.sh), after chapter 19's own decode attention kernel:
#   stage    carry also .dev/smollm2-1: decode attention alone (decode_attention.py --graph:
#            FlashInfer's against ours at a few split counts); its GPU test; decode at batch
#            1, 4 and 8 on this tree and on .dev/old's, in turn.
#   measure  carry .dev/smollm2-2: the official workload, three rounds each, this tree and
#            .dev/old's, in turn.
#   tests    carry .dev/smollm2-3: SmolLM2 and the tiny checkpoints built here, then the GPU
#            tests of every chapter on this tree; chapter 19's main on its own tree; the
#            roofline's per-step record.
# Before the first call, here:  rm -rf .dev/old && mkdir -p .dev/old &&
#   git archive BEFORE python steps benchmark tools | tar -x -C .dev/old
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session13.sh probe|stage|measure|tests}
source benchmark/h200/setup.sh
R=$OUT/s13-$part && mkdir -p $R
M=models/qwen3-0.6b-random
export PYTHONPATH=python:$PYTHONPATH  # the benchmarks import minisgl from this tree
OLD=.dev/old/python:$PYTHONPATH
case $part in
probe)
    host_speed > $R/host.txt 2>&1
    timeout 60 python3 benchmark/h200/gemv_bench.py > $R/gemv_bench.txt 2>&1
    tail -n 8 $R/gemv_bench.txt
    b1="--model $M --attn flashinfer --batch 1 --top 40"
    for run in 1 2; do
        timeout 100 python3 benchmark/decode_profile.py $b1 > $R/decode_b1_after$run.txt 2>&1
        PYTHONPATH=$OLD timeout 60 python3 .dev/old/benchmark/decode_profile.py $b1 \
            > $R/decode_b1_before$run.txt 2>&1
    done
    grep -A2 "^decode" $R/decode_b1_*.txt
    timeout 240 python3 benchmark/h200/decode_attention.py --graph --batch 1 2 4 8 32 \
        --context 512 1024 --page-size 16 256 > $R/decode_attention_graph.txt 2>&1
    cat $R/decode_attention_graph.txt ;;
stage)
    host_speed > $R/host.txt 2>&1
    timeout 200 python3 benchmark/h200/decode_attention.py --graph --batch 1 2 4 8 16 \
        --context 512 1024 4096 --page-size 16 > $R/decode_attention_graph.txt 2>&1
    cat $R/decode_attention_graph.txt
    timeout 100 python3 -m pytest -q tests/test_cuda_kernels_cuda.py -k decode_attention \
        > $R/pytest_decode_attention.txt 2>&1
    tail -n 3 $R/pytest_decode_attention.txt
    for batch in 1 1 4 8; do
        b="--model $M --attn flashinfer --batch $batch --top 40"
        timeout 100 python3 benchmark/decode_profile.py $b >> $R/decode_b${batch}_after.txt 2>&1
        PYTHONPATH=$OLD timeout 60 python3 .dev/old/benchmark/decode_profile.py $b \
            >> $R/decode_b${batch}_before.txt 2>&1
    done
    grep -A2 "^decode" $R/decode_b*.txt | grep flashinfer ;;
measure)
    args="--device cuda --model $M --attn flashinfer --rounds 3 --skip-transformers"
    timeout 150 python3 benchmark/offline.py $args --json $R/offline_after.json \
        > $R/offline_after.txt 2>&1
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
    python3 tools/steps.py build 19 /tmp/ch19 > /dev/null  # models/ links to the checkpoints
    (cd /tmp/ch19 && timeout 120 python3 main.py > $R/ch19_main.txt 2>&1)
    tail -n 12 $R/ch19_main.txt
    timeout 100 python3 benchmark/roofline.py --device cuda --model $M --workload official \
        --json $R/roofline.json > $R/roofline.txt 2>&1
    tail -n 9 $R/roofline.txt ;;
esac
