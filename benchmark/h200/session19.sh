#!/usr/bin/env bash
# 2026-12-03, session 19's H200 calls on issue 27. Chapter 19's decode attention cut every
# request of a step into the same number of chunks (one at batch 66 and above), so a step whose
# contexts run from 100 to 2,000 tokens lasted as long as its longest request: at batch 64 of
# the official workload's contexts it read 2.4-3.0 TB/s where uniform ones read 3.9-4.1
# (ch19_decode_attention_order_s17). Now a one-block plan kernel, once a step inside the graph,
# cuts the contexts into chunks, longest request first (the host's sort before each replay is
# gone).
#   kernels   a fresh machine, carry [".whl", ".dev/smol-tok", ".dev/old"] (.dev/old: 3e60915,
#             `git archive 3e60915 python benchmark tools tests steps | tar -x -C .dev/old`):
#             the kernel's GPU tests; decode_attention.py --mixed (the official workload's
#             contexts at batch 8-256, three steps) against the tree before (and, from the
#             third call on, at batch 8-32 at the chunk counts its engine chose: its --mixed
#             cut one a request);
#             --graph (uniform contexts, batch 1-32), chunks of at least 64 and 128 tokens,
#             against the tree before at the chunk counts it chose.
# The first call ran a first plan (chunks of total / (W x a wave's chunks) tokens; its code is
# not kept, and decode_attention.py took --waves: 1 2 4 8 in --mixed, 1 2 4 in --graph; no
# graph_before). It showed (book/runs/ch19_decode_attention_s19.h200.txt): batch 8-32 of
# mixed contexts 25-55% faster than the tree before at one chunk a request (not what its engine
# ran there: the third call measured that), batch 64 up to 10% with two waves, batch 128 13% slower with
# two waves than with one (more blocks, each paying its start and merge), and at batch 8-32 of
# uniform contexts a size from the total alone made 1.1-1.5 waves, slower than the tree
# before; the plan kernel took 4-43 us (64-bit divisions in its n^2 loop). So the plan now
# fits the chunks to one wave (two where one would idle a quarter of its time), with the
# counts in shared memory.
# The second call of kernels (a fresh machine, e6ee68c) measured this plan, then workload and
# finish on the same machine. The plan kernel still took up to 20 us (its lengths read one after
# another from memory); reading them a tile at a time through shared memory (723d5b0), a third
# call of kernels and a second of workload (with the timeline) measured it, on another machine.
#   workload  the same warm machine, no carry: the official workload three rounds each, this
#             tree and the tree before; tp_decode.py at batch 1, both trees; (its second call)
#             timeline.py at batch 16.
#   finish    the same warm machine, no carry: the roofline, this tree.
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session19.sh kernels|workload|finish}
source benchmark/h200/setup.sh
R=$OUT/s19-$part && mkdir -p $R
export PYTHONPATH=python:$PYTHONPATH
M=models/qwen3-0.6b-random
OLD="env PYTHONPATH=.dev/old/python:$PYTHONPATH python3 .dev/old/benchmark"  # the tree before
case $part in
kernels)
    host_speed > $R/host.txt 2>&1
    cat $R/host.txt
    timeout 150 python3 -m pytest -q -rs tests/test_cuda_kernels_cuda.py -k decode_attention \
        > $R/pytest_kernel.txt 2>&1
    tail -n 3 $R/pytest_kernel.txt
    # The first FlashInfer run on a fresh machine builds its kernels (JIT, about 70 s).
    mixed="--mixed --batch 8 16 32 64 128 256"
    timeout 200 python3 benchmark/h200/decode_attention.py $mixed > $R/mixed.txt 2>&1
    cat $R/mixed.txt
    timeout 100 $OLD/h200/decode_attention.py $mixed > $R/mixed_before.txt 2>&1
    cat $R/mixed_before.txt
    # Its --mixed cuts every request into one chunk; its engine cut batch 8, 16, 32 into 8, 4, 2.
    PYTHONPATH=.dev/old/python:$PYTHONPATH timeout 60 python3 - > $R/mixed_before_small.txt \
        2>&1 <<'PY'
import sys
sys.path[:0] = [".dev/old/benchmark/h200", ".dev/old/benchmark"]
from decode_attention import ours_microseconds
from offline import official_workload
prompts = [len(p) for p in official_workload()[0]]
for batch, splits in ((8, 8), (16, 4), (32, 2)):
    for step, extra in (("first", 0), ("+300", 300), ("+600", 600)):
        contexts = [n + extra for n in prompts[:batch]]
        print(f"batch {batch:>3} {step:>5}: {splits} chunks a request, "
              f"{ours_microseconds(contexts, 256, splits, 16):.1f} us")
PY
    cat $R/mixed_before_small.txt
    graph="--graph --batch 1 2 4 8 16 32 --context 1024 4096 --page-size 256"
    timeout 120 python3 benchmark/h200/decode_attention.py $graph --min-chunk 64 128 \
        > $R/graph.txt 2>&1
    cat $R/graph.txt
    # The tree before cut batch b into min(64, 528 / (8 b)) chunks a request: 64, 33, 16, ...
    timeout 120 $OLD/h200/decode_attention.py $graph --splits 2 4 8 16 33 64 \
        > $R/graph_before.txt 2>&1
    cat $R/graph_before.txt ;;
workload)
    host_speed > $R/host.txt 2>&1
    cat $R/host.txt
    args="--device cuda --model $M --attn flashinfer --rounds 3 --skip-transformers"
    timeout 130 python3 benchmark/offline.py $args --json $R/offline_after.json \
        > $R/offline_after.txt 2>&1
    timeout 110 $OLD/offline.py $args --json $R/offline_before.json > $R/offline_before.txt 2>&1
    tail -n 3 $R/offline_*.txt
    decode="--model $M --tp 1 --batch 1 --device cuda --attn flashinfer"
    timeout 60 python3 benchmark/tp_decode.py $decode > $R/tp_decode.txt 2>&1
    timeout 60 $OLD/tp_decode.py $decode > $R/tp_decode_before.txt 2>&1
    grep -h "^measured" $R/tp_decode*.txt
    # Is the GPU waiting for the host at batch 16 (the roofline's batch 9-32 steps)?
    timeout 90 python3 benchmark/timeline.py --device cuda --model $M --batch 16 \
        --json $R/timeline_b16.json > $R/timeline_b16.txt 2>&1
    tail -n 6 $R/timeline_b16.txt ;;
finish)
    timeout 100 python3 benchmark/roofline.py --device cuda --model $M --workload official \
        --json $R/roofline.json > $R/roofline.txt 2>&1
    tail -n 12 $R/roofline.txt ;;
esac
