#!/usr/bin/env bash
# 2026-12-03, session 14's H200 calls on issue 27, each part a call on one warm machine, carry
# [".whl", ".dev/smol-tok", ".dev/old", ".dev/smollm2-N"] (SmolLM2's wheel travels in three
# parts, one a call, as in session12.sh):
#   stage    (.dev/smollm2-1) chapter 19's decode attention kernel, second design (a block per
#            KV head and chunk, GQA heads together, 16-byte loads, the first tile loaded before
#            the PDL wait): the kernel alone against FlashInfer's graph decode
#            (decode_attention.py --graph); its GPU tests; decode at batch 1, 4 and 8 on this
#            tree and on .dev/old's, in turn.
#   final    (no SmolLM2) after OWN_DECODE_MAX_BATCH went from 8 to 2 on stage's numbers: the
#            GPU tests of chapters 17-19 (those that need SmolLM2's weights skip), then decode at
#            batch 1 and 2 on this tree and on .dev/old's, in turn, twice.
#   gated    (no SmolLM2) the gated GEMV (gate_up_proj + activation, 29c380c) against .dev/old
#            at 540ec3f: its GPU test, then decode at batch 1 on both trees, in turn, twice.
#   measure  (.dev/smollm2-2) the official workload, three rounds each, this tree and .dev/old's,
#            in turn.
#   tests    (.dev/smollm2-3) SmolLM2 and the tiny checkpoints built here, then the GPU tests of
#            every chapter on this tree; chapter 19's main on its own tree; the roofline's
#            per-step record.
# Before the first call, here:  rm -rf .dev/old && mkdir -p .dev/old &&
#   git archive BEFORE python steps benchmark tools | tar -x -C .dev/old
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session14.sh stage|final|gated|measure|tests}
source benchmark/h200/setup.sh
R=$OUT/s14-$part && mkdir -p $R
M=models/qwen3-0.6b-random
export PYTHONPATH=python:$PYTHONPATH  # the benchmarks import minisgl from this tree
OLD=.dev/old/python:$PYTHONPATH
# One decode step profiled per batch size given, on this tree then on .dev/old's, in turn.
decode_in_turn() {
    for batch in "$@"; do
        b="--model $M --attn flashinfer --batch $batch --top 40"
        timeout 100 python3 benchmark/decode_profile.py $b >> $R/decode_b${batch}_after.txt 2>&1
        PYTHONPATH=$OLD timeout 60 python3 .dev/old/benchmark/decode_profile.py $b \
            >> $R/decode_b${batch}_before.txt 2>&1
    done
    grep -A2 "^decode" $R/decode_b*.txt | grep flashinfer
}
case $part in
stage)
    host_speed > $R/host.txt 2>&1
    cat $R/host.txt
    timeout 100 python3 -m pytest -q tests/test_cuda_kernels_cuda.py -k "decode_attention or gemv" \
        > $R/pytest_kernels.txt 2>&1
    tail -n 3 $R/pytest_kernels.txt
    timeout 200 python3 benchmark/h200/decode_attention.py --graph --batch 1 2 4 8 \
        --context 512 1024 4096 --page-size 16 --splits 4 8 16 33 64 > $R/decode_attention_graph.txt 2>&1
    cat $R/decode_attention_graph.txt
    decode_in_turn 1 1 4 8 ;;
final)
    host_speed > $R/host.txt 2>&1
    timeout 300 python3 -m pytest -q -rs tests/test_cuda_kernels_cuda.py \
        tests/test_cuda_graph_cuda.py tests/test_gpu_attention_cuda.py > $R/pytest_gpu.txt 2>&1
    tail -n 12 $R/pytest_gpu.txt
    decode_in_turn 1 2 1 2 ;;
gated)
    host_speed > $R/host.txt 2>&1
    timeout 60 python3 -m pytest -q tests/test_cuda_kernels_cuda.py -k "gated" > $R/pytest_gated.txt 2>&1
    tail -n 2 $R/pytest_gated.txt
    decode_in_turn 1 1 ;;
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
