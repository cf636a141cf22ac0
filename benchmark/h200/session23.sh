#!/usr/bin/env bash
# 2026-12-04, session 23's H200 calls on issue 27.
#   probe   a fresh machine, carry [".whl", ".dev/smol-tok", ".dev/old"] (.dev/old: 7714bcf, the
#           tree before the engine's warm-up, with this tree's first_round.py copied in: `git
#           archive 7714bcf python benchmark tools tests steps | tar -x -C .dev/old`): where a
#           process's first round of the official workload loses its 0.1-0.2 s, both trees
#           (first_round.py); chapter 18's GPU tests (the warm-up among them); the prefill
#           steps' host phases on this tree (chapter 9's admission, not yet measured here).
#   measure a fresh machine, the same carry (first_round.py now lists round 1's slowest steps
#           against round 2's): first_round.py again, the tree before first this time (in
#           probe, 7714bcf's round 1 lost 270 ms of idle stream before decode steps, in the
#           call's second process); then the official workload, the two trees in turn, three
#           processes each, three rounds a process (a new LLM each round, as offline.py runs
#           it; round 1 is what the official harness times).
#   confirm a fresh machine, the same carry (.dev/old with the first_round.py that counts Python's
#           full garbage collections): the 210-220 ms idle before one decode step of round 1 in
#           measure, both trees, looked like the process's first full collection. Now the
#           scheduler collects once at start, on a GPU. first_round.py, the tree before, this
#           tree, this tree, the tree before; chapter 18's GPU tests; then the official
#           harness's measure: one timed round in a fresh process (--rounds 1), the two trees in
#           turn, four processes each.
#   final   a fresh machine, carry [".whl", ".dev/smol-tok"]: the roofline's step records of the
#           official workload on this tree (the first prefill step no longer an outlier?), and
#           batch-1 decode, three processes.
#   second  the same warm machine, no carry: the one first-round outlier left is the second prefill
#           step (16,415 rows, the first mixed step). A new row count? first_round.py, two rounds,
#           with one more warm-up prefill of 16,415 tokens, then without.
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session23.sh probe|measure|confirm|final|second}
source benchmark/h200/setup.sh
R=$OUT/s23-$part && mkdir -p $R
export PYTHONPATH=python:$PYTHONPATH
M=models/qwen3-0.6b-random
OLD="env PYTHONPATH=.dev/old/python:$PYTHONPATH python3 .dev/old/benchmark"  # the tree before

# The official workload, this tree and .dev/old in turn, $2 processes each, $1 rounds a process
# (a new LLM each round; round 1 is what the official harness times), into $R/offline.txt and a
# JSON per process.
offline_in_turn() {
    local args="--device cuda --model $M --attn flashinfer --rounds $1 --skip-transformers" n
    for n in $(seq $2); do
        { echo "\$ python3 benchmark/offline.py $args   # this tree, $n"
          timeout 60 python3 benchmark/offline.py $args --json $R/offline_after$n.json
          echo "\$ python3 .dev/old/benchmark/offline.py $args   # 7714bcf, $n"
          timeout 60 $OLD/offline.py $args --json $R/offline_before$n.json
        } >> $R/offline.txt 2>&1
    done
    grep -v "capturing" $R/offline.txt | grep "LLM.generate：\|^\\$"
}
case $part in
probe)
    { host_speed
      echo "\$ python3 benchmark/h200/first_round.py   # this tree"
      timeout 200 python3 benchmark/h200/first_round.py --model $M
      echo "\$ python3 .dev/old/benchmark/h200/first_round.py   # 7714bcf"
      timeout 170 $OLD/h200/first_round.py --model $M
    } > $R/first_round.txt 2>&1
    grep -v "capturing\|warn" $R/first_round.txt
    python3 tools/models.py --only tiny-qwen3 > /dev/null
    timeout 100 python3 -m pytest -q -rs tests/test_cuda_graph_cuda.py > $R/tests.txt 2>&1
    tail -n 4 $R/tests.txt
    timeout 60 python3 benchmark/h200/prefill_gaps.py --model $M --no-profiler \
        > $R/prefill_host.txt 2>&1
    grep -v "capturing\|warn" $R/prefill_host.txt ;;
measure)
    { host_speed
      echo "\$ python3 .dev/old/benchmark/h200/first_round.py   # 7714bcf"
      timeout 170 $OLD/h200/first_round.py --model $M
      echo "\$ python3 benchmark/h200/first_round.py   # this tree"
      timeout 100 python3 benchmark/h200/first_round.py --model $M
    } > $R/first_round.txt 2>&1
    grep -v "capturing\|warn" $R/first_round.txt
    offline_in_turn 3 3 ;;
confirm)
    { host_speed
      for tree in old new new old; do
          if [ $tree = old ]; then
              echo "\$ python3 .dev/old/benchmark/h200/first_round.py   # 7714bcf"
              timeout 150 $OLD/h200/first_round.py --model $M
          else
              echo "\$ python3 benchmark/h200/first_round.py   # this tree"
              timeout 150 python3 benchmark/h200/first_round.py --model $M
          fi
      done; } > $R/first_round.txt 2>&1
    grep -v "capturing\|warn" $R/first_round.txt | grep "^\\$\|^round"
    python3 tools/models.py --only tiny-qwen3 > /dev/null
    timeout 60 python3 -m pytest -q -rs tests/test_cuda_graph_cuda.py > $R/tests.txt 2>&1
    tail -n 3 $R/tests.txt
    offline_in_turn 1 4 ;;
final)
    { host_speed
      timeout 150 python3 benchmark/roofline.py --device cuda --model $M --workload official \
          --json $R/roofline.json; } > $R/roofline.txt 2>&1
    grep -v "capturing\|warn" $R/roofline.txt
    for n in 1 2 3; do
        timeout 60 python3 benchmark/tp_decode.py --model $M --tp 1 --batch 1 --device cuda \
            --attn flashinfer
    done > $R/tp_decode.txt 2>&1
    grep -h "^measured" $R/tp_decode.txt ;;
second)
    { echo "\$ python3 benchmark/h200/first_round.py --rounds 2 --also-warm-up 16415"
      timeout 80 python3 benchmark/h200/first_round.py --model $M --rounds 2 --also-warm-up 16415
      echo "\$ python3 benchmark/h200/first_round.py --rounds 2"
      timeout 80 python3 benchmark/h200/first_round.py --model $M --rounds 2
    } > $R/first_round.txt 2>&1
    grep -v "capturing\|warn" $R/first_round.txt ;;
esac
