#!/usr/bin/env bash
# 2026-12-03, session 16's H200 calls on issue 27 (`kernels` prepared in session 15). Chapter
# 19's decode attention (d1f0b04) against three experiments kept on branches:
#   .dev/nt  exp/attention-new-token-after  the new token added after the loop instead of
#            selected per token inside it: 689 -> 635 SASS instructions a pass of Qwen3's build,
#            134 -> 128 registers, so four blocks an SM instead of three (won: merged)
#   .dev/b4  exp/attention-bounds4          __launch_bounds__(128, 4) for bfloat16 and 1-2 query
#            heads a KV head: 128 registers, no spills, four blocks an SM
#   .dev/t2  exp/attention-tile2            2 tokens a thread per tile: 96 registers, five blocks
# Session 15 measured ours at 3.3-3.5 TB/s from batch 32 on, FlashInfer at 3.9-4.2
# (book/runs/ch19_decode_attention_s15.h200.txt); these test whether more warps an SM close it.
# One call on a fresh machine, carry [".whl", ".dev/smol-tok", ".dev/nt", ".dev/b4", ".dev/t2"]:
#   kernels  each tree's decode_attention.py --graph at batch 1-256 (FlashInfer's columns come
#            with every tree: their spread is the noise between the trees' runs).
# Before the call, here:
#   for b in new-token-after:nt bounds4:b4 tile2:t2; do rm -rf .dev/${b#*:} && mkdir -p .dev/${b#*:} &&
#     git archive exp/attention-${b%:*} python steps benchmark tools tests | tar -x -C .dev/${b#*:}; done
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session16.sh kernels|measure|decode|tests|five|final}
source benchmark/h200/setup.sh
R=$OUT/s16-$part && mkdir -p $R
case $part in
kernels)
    host_speed > $R/host.txt 2>&1
    for tree in . .dev/nt .dev/b4 .dev/t2; do
        name=$( [ $tree = . ] && echo main || basename $tree )
        PYTHONPATH=$tree/python:$PYTHONPATH timeout 60 python3 -m pytest -q \
            $tree/tests/test_cuda_kernels_cuda.py -k decode_attention >> $R/attention_$name.txt 2>&1
        PYTHONPATH=$tree/python:$PYTHONPATH timeout 60 python3 $tree/benchmark/h200/decode_attention.py \
            --graph --batch 1 2 4 8 --context 512 4096 --page-size 16 --splits 4 16 33 \
            >> $R/attention_$name.txt 2>&1
        PYTHONPATH=$tree/python:$PYTHONPATH timeout 100 python3 $tree/benchmark/h200/decode_attention.py \
            --graph --batch 16 32 64 128 256 --context 512 1024 2048 --page-size 256 --splits 1 2 4 \
            >> $R/attention_$name.txt 2>&1
        tail -n 18 $R/attention_$name.txt
    done ;;
measure)
    # carry [".whl", ".dev/smol-tok", ".dev/old", ".dev/smollm2-1"] (.dev/old: d1f0b04, before
    # the merge): the official workload, three rounds each: this tree with ours at every graph
    # size, this tree with the bound at 2, the tree before.
    M=models/qwen3-0.6b-random
    args="--device cuda --model $M --attn flashinfer --rounds 3 --skip-transformers"
    OLD=.dev/old/python:$PYTHONPATH
    host_speed > $R/host.txt 2>&1
    # The first run on a fresh machine also builds FlashInfer's kernels (JIT, about 70 s).
    PYTHONPATH=python:$PYTHONPATH MINISGL_OWN_DECODE_MAX_BATCH=256 timeout 240 python3 \
        benchmark/offline.py $args --json $R/offline_own.json > $R/offline_own.txt 2>&1
    PYTHONPATH=python:$PYTHONPATH MINISGL_OWN_DECODE_MAX_BATCH=2 timeout 150 python3 \
        benchmark/offline.py $args --json $R/offline_bound2.json > $R/offline_bound2.txt 2>&1
    PYTHONPATH=$OLD timeout 150 python3 .dev/old/benchmark/offline.py $args \
        --json $R/offline_before.json > $R/offline_before.txt 2>&1
    tail -n 3 $R/offline_*.txt ;;
decode)
    # Next, on the warm machine, carry [".dev/old", ".dev/smollm2-2"]: the batch-1
    # measure, tp_decode.py three times on this tree and on .dev/old's, in turn.
    decode="--model models/qwen3-0.6b-random --tp 1 --batch 1 32 256 --device cuda --attn flashinfer"
    for n in 1 2 3; do
        PYTHONPATH=python:$PYTHONPATH timeout 75 python3 benchmark/tp_decode.py $decode \
            >> $R/tp_decode_after.txt 2>&1
        PYTHONPATH=.dev/old/python:$PYTHONPATH timeout 75 python3 .dev/old/benchmark/tp_decode.py \
            $decode >> $R/tp_decode_before.txt 2>&1
    done
    grep -h "^measured" $R/tp_decode_after.txt $R/tp_decode_before.txt ;;
tests)
    # Then, carry [".dev/smollm2-3"]: SmolLM2 and the tiny checkpoints built here, chapters 19
    # and 18's GPU tests on this tree; the roofline's per-step record.
    smollm2_from_parts $R/models.txt
    tail -n 3 $R/models.txt
    export PYTHONPATH=python:$PYTHONPATH
    timeout 300 python3 -m pytest -q -rs tests/test_cuda_kernels_cuda.py \
        tests/test_cuda_graph_cuda.py > $R/pytest_gpu.txt 2>&1
    tail -n 12 $R/pytest_gpu.txt
    timeout 120 python3 benchmark/roofline.py --device cuda --model models/qwen3-0.6b-random \
        --workload official --json $R/roofline.json > $R/roofline.txt 2>&1
    tail -n 9 $R/roofline.txt ;;
five)
    # Right after `tests` on the same machine (SmolLM2 built there), MINISGL_OWN_DECODE_MAX_BATCH
    # =256 as for `tests`: the new test of five requests through our attention, and the
    # exactness test it sits beside.
    PYTHONPATH=python:$PYTHONPATH timeout 200 python3 -m pytest -q -rs -s \
        tests/test_cuda_kernels_cuda.py -k "five_requests or same_greedy" > $R/pytest_five.txt 2>&1
    tail -n 5 $R/pytest_five.txt ;;
final)
    # A fresh machine, carry [".whl", ".dev/smol-tok"], after the default became ours at every
    # graph size (the scratch now sized by the captured size with the most chunks): the official
    # workload once with every default, as a check that it runs, not a measure.
    PYTHONPATH=python:$PYTHONPATH timeout 200 python3 benchmark/offline.py --device cuda \
        --model models/qwen3-0.6b-random \
        --attn flashinfer --rounds 1 --skip-transformers > $R/offline_default.txt 2>&1
    tail -n 3 $R/offline_default.txt ;;
esac
