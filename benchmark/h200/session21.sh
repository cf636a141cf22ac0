#!/usr/bin/env bash
# 2026-12-04, session 21's H200 calls on issue 27. The decode step's projections took cuBLAS
# 0.69-0.79 ms at every batch size, about 3x what their weights and FLOPs need
# (ch21_gemm_shapes_s18): chapter 19 now has its own GEMM for 5-256 rows (gemm.cu: split-K over
# all SMs, tensor cores, weights loaded under PDL).
#   one     a fresh machine, carry [".whl", ".dev/smol-tok", ".dev/old"] (.dev/old: d8662af,
#           `git archive d8662af python benchmark tools tests steps | tar -x -C .dev/old`):
#           the GEMM's and GEMV's GPU tests; gemm_shapes.py with our column and a sweep of
#           split counts, the LM head too; decode_profile.py at batch 16 and 256, both trees.
#   two     a fresh machine, the same carry: the official workload three rounds each, both
#           trees; batch 1 and 32 (tp_decode.py), both trees; the GEMM's tests.
# Results go straight to $OUT, so a run cut by the call's limit still returns. At most eight
# files come back from a call: each part writes fewer.
set -uo pipefail
part=${1:?usage: session21.sh one|two}
source benchmark/h200/setup.sh
R=$OUT/s21-$part && mkdir -p $R
export PYTHONPATH=python:$PYTHONPATH
M=models/qwen3-0.6b-random
OLD="env PYTHONPATH=.dev/old/python:$PYTHONPATH python3 .dev/old/benchmark"  # the tree before
case $part in
one)
    { host_speed; timeout 200 python3 -m pytest -q -rs tests/test_cuda_kernels_cuda.py \
        -k "gemm or gemv"; } > $R/kernels.txt 2>&1
    cat $R/kernels.txt
    timeout 240 python3 benchmark/h200/gemm_shapes.py --no-triton --rows 8 16 32 64 128 256 \
        --splits 1 2 4 8 16 --lm-head > $R/gemm_shapes.txt 2>&1
    cat $R/gemm_shapes.txt
    for batch in 16 256; do
        profile="--attn flashinfer --batch $batch --prompt-len 700 --page-size 256 \
            --temperature 0.6 --top 12"
        timeout 100 python3 benchmark/decode_profile.py $profile > $R/profile_b$batch.txt 2>&1
        timeout 60 $OLD/decode_profile.py $profile > $R/profile_b${batch}_before.txt 2>&1
        grep -h -A1 "batch  " $R/profile_b$batch*.txt
    done ;;
two)
    args="--device cuda --model $M --attn flashinfer --rounds 3 --skip-transformers"
    { host_speed; timeout 150 python3 benchmark/offline.py $args --json $R/offline_after.json
    } > $R/offline_after.txt 2>&1
    timeout 130 $OLD/offline.py $args --json $R/offline_before.json > $R/offline_before.txt 2>&1
    tail -n 3 $R/offline_*.txt
    for tree in after before; do
        run="python3 benchmark/tp_decode.py" && [ $tree = before ] && run="$OLD/tp_decode.py"
        timeout 90 $run --model $M --tp 1 --batch 1 32 --device cuda --attn flashinfer \
            > $R/tp_decode_$tree.txt 2>&1
        grep -h "^measured" $R/tp_decode_$tree.txt
    done ;;
esac
