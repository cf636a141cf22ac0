#!/usr/bin/env bash
# 2026-12-04, session 22's H200 calls on issue 27.
#   probe   a fresh machine, carry [".whl", ".dev/smol-tok"]: prefill_gaps.py (what the host
#           does while the GPU waits in the official workload's prefill steps: about 0.2 s of
#           the run by the roofline's record) and attention_share.py (decode attention's cost
#           inside the step's graph, no profiler, against the kernel alone on the same
#           contexts: session 21 saw 7-11% more under the profiler).
#   measure a fresh machine, carry [".whl", ".dev/smol-tok", ".dev/old"] (.dev/old: fae4544, the
#           tree before chapter 18's change: `git archive fae4544 python benchmark tools tests
#           steps | tar -x -C .dev/old`): a prefill in flight is read after the next prefill is
#           launched. The official workload three rounds each, this tree and the one before;
#           the roofline's step records (idle before each step), both trees.
#   probe2  the same warm machine, no carry: attention_share.py again, one batch a process
#           (the first run's batch 256 ran with 64 requests in flight); prefill_gaps.py and
#           batch-1 decode on this tree.
#   confirm a fresh machine, the same carry, with this tree's prefill_gaps.py copied into .dev/old
#           (it finds the library next to itself): the official workload again, this tree and
#           the one before in turn, twice, three rounds each; prefill_gaps.py --no-profiler,
#           both trees; attention_share.py with a pool of its own size per engine (in probe2
#           the second engine of a process fit 41 and 82 requests of 128 and 256).
#   cprof   a fresh machine, carry [".whl", ".dev/smol-tok"]: prefill_gaps.py --no-profiler
#           --cprofile 45 (confirm found the host never waiting for the device in the prefill
#           steps, 31 ms a step in the eager forward: which functions).
#           (Run twice: the second time with every F.linear call timed. The LM head's first call
#           at a new row count took 18-23 ms.)
#   lmhead  a fresh machine, carry [".whl", ".dev/smol-tok", ".dev/old"] (.dev/old: 6ae316a, with
#           this tree's prefill_gaps.py): an eager batch's LM head scores rows padded to a
#           captured size. Chapter 18's GPU tests; prefill_gaps.py --no-profiler --cprofile
#           both trees; the official workload, the two trees in turn, two processes each.
#   final   a fresh machine, carry [".whl", ".dev/smol-tok", ".dev/old"] (.dev/old: fae4544 again):
#           the official workload, this tree (both changes) and the tree before both, in turn,
#           two processes each, as far as the session's device time goes.
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session22.sh probe|measure|probe2|confirm|cprof|lmhead|final}
source benchmark/h200/setup.sh
R=$OUT/s22-$part && mkdir -p $R
export PYTHONPATH=python:$PYTHONPATH
M=models/qwen3-0.6b-random
OLD="env PYTHONPATH=.dev/old/python:$PYTHONPATH python3 .dev/old/benchmark"  # the tree before

# The official workload three rounds a process, this tree and .dev/old in turn, two processes
# each, into $R/offline.txt and a JSON per process. $1: the old tree's name; $2, $3: each
# process's time limit, this tree's first.
offline_in_turn() {
    local args="--device cuda --model $M --attn flashinfer --rounds 3 --skip-transformers" n
    for n in 1 2; do
        { echo "\$ python3 benchmark/offline.py $args   # this tree, $n"
          timeout $2 python3 benchmark/offline.py $args --json $R/offline_after$n.json
          echo "\$ python3 .dev/old/benchmark/offline.py $args   # $1, $n"
          timeout $3 $OLD/offline.py $args --json $R/offline_before$n.json
        } >> $R/offline.txt 2>&1
    done
}
case $part in
probe)
    { host_speed; timeout 200 python3 benchmark/h200/prefill_gaps.py --model $M; } \
        > $R/prefill_gaps.txt 2>&1
    grep -v "^USDT\|Warning\|warn(" $R/prefill_gaps.txt
    { host_speed; timeout 330 python3 benchmark/h200/attention_share.py --model $M; } \
        > $R/attention_share.txt 2>&1
    cat $R/attention_share.txt ;;
measure)
    host_speed > $R/host.txt 2>&1 && cat $R/host.txt
    args="--device cuda --model $M --attn flashinfer --rounds 3 --skip-transformers"
    timeout 160 python3 benchmark/offline.py $args --json $R/offline_after.json \
        > $R/offline_after.txt 2>&1
    timeout 110 $OLD/offline.py $args --json $R/offline_before.json > $R/offline_before.txt 2>&1
    tail -n 3 $R/offline_*.txt
    roofline="--device cuda --model $M --workload official"
    timeout 90 python3 benchmark/roofline.py $roofline --json $R/roofline_after.json \
        > $R/roofline_after.txt 2>&1
    timeout 90 $OLD/roofline.py $roofline --json $R/roofline_before.json \
        > $R/roofline_before.txt 2>&1
    tail -n 20 $R/roofline_*.txt ;;
probe2)
    { host_speed
      timeout 100 python3 benchmark/h200/attention_share.py --model $M --batch 64
      for batch in 128 256; do
          timeout 100 python3 benchmark/h200/attention_share.py --model $M --batch $batch \
              --no-header
      done; } > $R/attention_share.txt 2>&1
    grep -v "capturing" $R/attention_share.txt
    timeout 150 python3 benchmark/h200/prefill_gaps.py --model $M > $R/prefill_gaps.txt 2>&1
    grep -v "^USDT\|Warning\|warn(\|capturing" $R/prefill_gaps.txt
    timeout 60 python3 benchmark/tp_decode.py --model $M --tp 1 --batch 1 --device cuda \
        --attn flashinfer > $R/tp_decode.txt 2>&1
    grep -h "^measured" $R/tp_decode.txt ;;
confirm)
    host_speed > $R/offline.txt 2>&1
    offline_in_turn fae4544 160 110
    grep -v "capturing" $R/offline.txt | tail -n 20
    { echo "\$ python3 benchmark/h200/prefill_gaps.py --no-profiler   # this tree"
      timeout 60 python3 benchmark/h200/prefill_gaps.py --model $M --no-profiler
      echo "\$ python3 .dev/old/benchmark/h200/prefill_gaps.py --no-profiler   # fae4544"
      timeout 60 $OLD/h200/prefill_gaps.py --model $M --no-profiler
    } > $R/prefill_host.txt 2>&1
    grep -v "capturing\|warn" $R/prefill_host.txt
    { timeout 60 python3 benchmark/h200/attention_share.py --model $M --batch 64
      for batch in 128 256; do
          timeout 60 python3 benchmark/h200/attention_share.py --model $M --batch $batch \
              --no-header
      done; } > $R/attention_share.txt 2>&1
    grep -v "capturing" $R/attention_share.txt ;;
cprof)
    { host_speed
      timeout 120 python3 benchmark/h200/prefill_gaps.py --model $M --no-profiler --cprofile 45
    } > $R/prefill_cprofile.txt 2>&1
    grep -v "capturing\|warn" $R/prefill_cprofile.txt ;;
lmhead)
    { host_speed; timeout 120 python3 -m pytest -q -rs tests/test_cuda_graph_cuda.py; } \
        > $R/tests.txt 2>&1
    tail -n 4 $R/tests.txt
    { echo "\$ python3 benchmark/h200/prefill_gaps.py --no-profiler --cprofile 12   # this tree"
      timeout 90 python3 benchmark/h200/prefill_gaps.py --model $M --no-profiler --cprofile 12
      echo "\$ python3 .dev/old/benchmark/h200/prefill_gaps.py --no-profiler --cprofile 12   # 6ae316a"
      timeout 60 $OLD/h200/prefill_gaps.py --model $M --no-profiler --cprofile 12
    } > $R/prefill_host.txt 2>&1
    grep -v "capturing\|warn" $R/prefill_host.txt | grep "墙钟\|F.linear\|最慢\|分配器\|forward  "
    offline_in_turn 6ae316a 100 100
    grep "LLM.generate  " $R/offline.txt ;;
final)
    host_speed > $R/offline.txt 2>&1
    offline_in_turn fae4544 150 80
    grep "LLM.generate  \|host speed" $R/offline.txt ;;
esac
