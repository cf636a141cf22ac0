#!/usr/bin/env bash
# 2026-12-03, session 20's H200 calls on issue 27. Chapter 19's sampling kernel gave each row of
# logits one block: at batch 256 it read them at about 0.5 TB/s (0.13 ms a step), and below 132
# rows most SMs idled while a few walked the whole vocabulary. Now blocks of 2,048 columns each
# and a merge kernel. The host's work per step at small batches is profiled too (the timeline
# of session 19 showed the GPU waiting at batch 16).
#   one     a fresh machine, carry [".whl", ".dev/smol-tok", ".dev/old"] (.dev/old: 186614a,
#           `git archive 186614a python benchmark tools tests steps | tar -x -C .dev/old`):
#           the sampling kernel's GPU tests; sample_bench.py, this tree and the tree before;
#           decode_profile.py at temperature 0.6, batch 1 and 256, both trees.
#           (That call ran the first split: spans of 8,192 columns, eight groups a thread, 80
#           registers: 8x faster at batch 1, 7% slower at 256. Now 2,048 columns, two groups.)
#   two     a fresh machine, the same carry: sample_bench.py and decode_profile.py at batch 1,
#           both trees, as in one; the official workload three rounds each, both trees;
#           workload_profile.py on its first 16 requests (py-spy of the host at batch 16 and
#           below, the GPU's kernels).
#   three   the same warm machine, no carry: workload_profile.py on the whole workload; the
#           roofline and batch 1 (greedy), this tree.
# Results go straight to $OUT, so a run cut by the call's limit still returns. At most eight
# files come back from a call: each part writes fewer.
set -uo pipefail
part=${1:?usage: session20.sh one|two|three}
source benchmark/h200/setup.sh
R=$OUT/s20-$part && mkdir -p $R
export PYTHONPATH=python:$PYTHONPATH
M=models/qwen3-0.6b-random
OLD="env PYTHONPATH=.dev/old/python:$PYTHONPATH python3 .dev/old/benchmark"  # the tree before
case $part in
one|two)
    { host_speed; timeout 150 python3 -m pytest -q -rs tests/test_cuda_kernels_cuda.py \
        -k "sample or plan"; } > $R/kernels.txt 2>&1
    # The same script times either tree's kernel: PYTHONPATH decides which.
    { echo "\$ python3 benchmark/h200/sample_bench.py   # this tree"
      timeout 60 python3 benchmark/h200/sample_bench.py
      echo "\$ PYTHONPATH=.dev/old/python python3 benchmark/h200/sample_bench.py   # 186614a"
      PYTHONPATH=.dev/old/python:$PYTHONPATH timeout 60 python3 benchmark/h200/sample_bench.py
    } >> $R/kernels.txt 2>&1
    cat $R/kernels.txt
    # A whole decode step at the workload's temperature: batch 1 (one row: one SM worked) and,
    # in one, 256.
    batches="1 256" && [ $part = two ] && batches=1
    for batch in $batches; do
        profile="--attn flashinfer --batch $batch --prompt-len 700 --page-size 256 \
            --temperature 0.6 --top 12"
        timeout 100 python3 benchmark/decode_profile.py $profile > $R/profile_b$batch.txt 2>&1
        timeout 60 $OLD/decode_profile.py $profile > $R/profile_b${batch}_before.txt 2>&1
        grep -h -A1 "batch  " $R/profile_b$batch*.txt
    done
    [ $part = one ] && exit 0
    args="--device cuda --model $M --attn flashinfer --rounds 3 --skip-transformers"
    timeout 150 python3 benchmark/offline.py $args --json $R/offline_after.json \
        > $R/offline_after.txt 2>&1
    timeout 110 $OLD/offline.py $args --json $R/offline_before.json > $R/offline_before.txt 2>&1
    tail -n 3 $R/offline_*.txt
    timeout 120 python3 benchmark/h200/workload_profile.py --model $M --requests 16 --out /tmp \
        > $R/profile_16.txt 2>&1
    head -n 70 $R/profile_16.txt ;;
three)
    timeout 200 python3 benchmark/h200/workload_profile.py --model $M --out /tmp \
        > $R/profile.txt 2>&1
    head -n 60 $R/profile.txt
    timeout 100 python3 benchmark/roofline.py --device cuda --model $M --workload official \
        --json $R/roofline.json > $R/roofline.txt 2>&1
    tail -n 12 $R/roofline.txt
    timeout 60 python3 benchmark/tp_decode.py --model $M --tp 1 --batch 1 --device cuda \
        --attn flashinfer > $R/tp_decode.txt 2>&1
    grep -h "^measured" $R/tp_decode.txt ;;
esac
