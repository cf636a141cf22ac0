#!/usr/bin/env bash
# Prepared 2026-12-03 in session 16 for issue 27, not yet run. Since session 16 chapter 19's
# decode attention runs every graph, with 128 registers a thread: four blocks an SM, where the
# backend's chunk count still assumes two (BLOCKS_PER_SM, attention/flashinfer_backend.py). At
# batch 8 with 4,096-token contexts the engine's 5 chunks took 48.8 us with 4 and 41.7 with 16,
# FlashInfer 40.3 (book/runs/ch19_decode_attention_s16.h200.txt). This measures our kernel at
# the chunk counts two and four blocks an SM give (batch n: 33/n and 66/n rounded up, at most
# 64), and a few around them, so the rule is chosen from numbers:
#   splits  one call on a fresh machine, carry [".whl", ".dev/smol-tok"] (about 8 minutes), and
#           the same for Qwen3-8B's heads (32 query heads on 8 KV heads: the build for 4 query
#           heads a KV head, 206 registers, two blocks an SM): since session 16 our kernel runs
#           every graph for every model, and only Qwen3-0.6B's heads were measured.
# If four blocks an SM win at batch 2-32, set BLOCKS_PER_SM = 4, re-measure the official workload
# against the tree before (three rounds each, as session16.sh measure does) and teach it in ch19.
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session17.sh splits}
source benchmark/h200/setup.sh
R=$OUT/s17-$part && mkdir -p $R
export PYTHONPATH=python:$PYTHONPATH
case $part in
splits)
    host_speed > $R/host.txt 2>&1
    timeout 150 python3 benchmark/h200/decode_attention.py --graph --batch 1 2 4 8 \
        --context 512 1024 2048 4096 --page-size 16 --splits 5 9 17 33 64 > $R/splits.txt 2>&1
    timeout 120 python3 benchmark/h200/decode_attention.py --graph --batch 16 32 64 \
        --context 512 1024 2048 --page-size 256 --splits 1 2 3 5 >> $R/splits.txt 2>&1
    cat $R/splits.txt
    timeout 120 python3 benchmark/h200/decode_attention.py --graph --query-heads 32 \
        --batch 1 2 4 8 --context 512 4096 --page-size 16 --splits 5 9 17 33 > $R/group4.txt 2>&1
    timeout 150 python3 benchmark/h200/decode_attention.py --graph --query-heads 32 \
        --batch 16 32 64 128 256 --context 512 2048 --page-size 256 --splits 1 2 3 \
        >> $R/group4.txt 2>&1
    cat $R/group4.txt ;;
esac
