#!/usr/bin/env bash
# 2026-12-04, session 21's H200 call on issue 27. The decode step's projections took cuBLAS
# 0.69-0.79 ms at every batch size, about 3x what their weights and FLOPs need
# (ch21_gemm_shapes_s18). Commit a94908e gave chapter 19 its own GEMM for 5-256 rows
# (gemm.cu: split-K over all SMs, tensor cores, weights loaded under PDL); this call measured it
# and it was slower everywhere, so it was taken out (ch19 "试过、没有留下的第三处"). The script
# runs on that commit (`git checkout a94908e`): later trees have no gemm.cu and no --splits.
#   one     a fresh machine, carry [".whl", ".dev/smol-tok", ".dev/old"] (.dev/old: d8662af,
#           `git archive d8662af python benchmark tools tests steps | tar -x -C .dev/old`):
#           the GEMM's and GEMV's GPU tests; gemm_shapes.py with our column and a sweep of
#           split counts, the LM head too; decode_profile.py at batch 16 and 256, both trees.
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session21.sh one}
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
esac
