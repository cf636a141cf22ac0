#!/usr/bin/env bash
# 2026-12-03, session 17's H200 calls on issue 27. Where the official workload's decode steps
# spend their time above the bytes they must read (ch21_roofline_s16: 0.7 ms a step at batch 1,
# 1.9 at batch 96-256, about 1.7 s of the 6.1), and the measurements that choose what to change:
#   probe  a fresh machine, carry [".whl", ".dev/smol-tok"]:
#          - gemm_shapes.py: the four projections at 16-256 rows, cuBLAS (F.linear, cublasLt)
#            against a Triton matmul at its best tile, against their bound;
#          - decode_profile.py at batch 256, 700-token contexts, page 256, temperature 0.6 (the
#            official workload's decode at its largest), with today's default (our attention
#            at every graph size): GPU time by category, the step's span and its idle time;
#          - splits: our decode attention at the chunk counts two and four blocks an SM give at
#            batch 1-64 (the engine's rule assumes two; 128 registers now let four fit), chosen
#            from numbers, not assumed.
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session17.sh probe}
source benchmark/h200/setup.sh
R=$OUT/s17-$part && mkdir -p $R
export PYTHONPATH=python:$PYTHONPATH
case $part in
probe)
    host_speed > $R/host.txt 2>&1
    timeout 200 python3 benchmark/h200/gemm_shapes.py > $R/gemm.txt 2>&1
    cat $R/gemm.txt
    # The first FlashInfer run on a fresh machine builds its kernels (JIT, about 70 s).
    timeout 170 python3 benchmark/decode_profile.py --model models/qwen3-0.6b-random \
        --attn flashinfer --batch 256 --prompt-len 700 --page-size 256 --temperature 0.6 \
        --top 25 > $R/profile_b256.txt 2>&1
    cat $R/profile_b256.txt
    timeout 90 python3 benchmark/h200/decode_attention.py --graph --batch 1 2 4 8 \
        --context 1024 4096 --page-size 256 --splits 5 9 17 33 64 > $R/splits.txt 2>&1
    timeout 70 python3 benchmark/h200/decode_attention.py --graph --batch 16 32 64 \
        --context 1024 2048 --page-size 256 --splits 1 2 3 5 >> $R/splits.txt 2>&1
    cat $R/splits.txt ;;
esac
