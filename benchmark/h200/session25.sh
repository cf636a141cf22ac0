#!/usr/bin/env bash
# 2026-12-04, session 25's H200 calls on issue 27.
#   check   a fresh machine, carry [".whl", ".dev/smol-tok"]: the GPU tests of the engine's
#           stream ordering on the final tree (tests/test_cuda_graph_cuda.py with session 24's
#           graph-less second engine, never run on a GPU before; tests/test_overlap_gpu.py, the
#           late streams), then chapter 21's overlap timeline at batch 256 and 16.
#   ablate  the same warm machine, no carry: chapter 21's ablation table with transformers in
#           the same call (session 24's second table had to leave it out).
#   pdl     the same warm machine, no carry: how much of a decode step's GEMM time programmatic
#           dependent launch could take back (pdl_gemm.py: the 112 GEMMs of one decode step of
#           the Qwen3-0.6B shape, distinct weights, in a CUDA graph: cuBLAS, then a Triton GEMM
#           without and with PDL; the machine may be a fresh one, carry [".whl", ".dev/smol-tok",
#           ".dev/old"]); then, as the check call's timeline at batch 16 ran on a host 20% slower
#           than session 21's, that timeline again on session 21's tree (.dev/old = `git archive
#           112e913 python benchmark tools tests steps`) and on this one, one after the other.
#   ab      the same carry, fresh or warm: the host's speed moved between 0.54 and 1.17 s within
#           the calls above, and batch 16 follows it; the timeline at batch 16 on session 21's
#           tree and this one taken in turn, twice each, each with the host's speed next to it.
#   b256    the same carry: the check call's timeline at batch 256 had the host working longer
#           than a step (profiler and all); twice more on this tree, the host's speed around each.
#   nofix   carry [".whl", ".dev/smol-tok", ".dev/nofix"] (`git archive` of this tree with chapter
#           20's engine.py, the one python/minisgl uses, missing its constructor's
#           `synchronize(self.device)`): does the GPU test of session 24's race fail without the
#           fix? Three times on that tree, then once on this one.
#   review  a fresh machine, no carry: read_speed.py after the review (its two (request, KV
#           head) kernels are one with strides, its timing is minisgl/benchmark/perf.py's), to
#           see that it still runs and reads as before (session 24: head 176.6 us at batch 256).
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session25.sh check|ablate|pdl|ab|b256|nofix|review}
if [ $part = review ]; then  # torch and triton only: the image has them
    mkdir -p $OUT/s25-review
    PYTHONPATH=python timeout 300 python3 benchmark/h200/read_speed.py --batch 256 --context 718 \
        2>&1 | tee $OUT/s25-review/read_speed.txt
    exit
fi
source benchmark/h200/setup.sh
R=$OUT/s25-$part && mkdir -p $R
export PYTHONPATH=python:$PYTHONPATH
M=models/qwen3-0.6b-random
case $part in
check)
    python3 tools/models.py --only tiny-qwen3 --only tiny-llama > /dev/null
    { host_speed
      echo "\$ python3 -m pytest -q -rs tests/test_cuda_graph_cuda.py tests/test_overlap_gpu.py"
      timeout 200 python3 -m pytest -q -rs tests/test_cuda_graph_cuda.py tests/test_overlap_gpu.py
    } > $R/tests.txt 2>&1
    tail -n 6 $R/tests.txt
    for b in 256 16; do
        { host_speed
          echo "\$ python3 benchmark/timeline.py --device cuda --model $M --batch $b"
          timeout 150 python3 benchmark/timeline.py --device cuda --model $M \
            --batch $b --json $R/timeline_b$b.json; } > $R/timeline_b$b.txt 2>&1
        grep -v "capturing" $R/timeline_b$b.txt | tail -n 10
    done ;;
ablate)
    { host_speed
      echo "\$ python3 benchmark/offline.py --device cuda --model $M --attn flashinfer --ablate overlap cuda-graph custom-kernels radix page-16"
      timeout 560 python3 benchmark/offline.py --device cuda --model $M --attn flashinfer \
          --ablate overlap cuda-graph custom-kernels radix page-16 --json $R/offline.json \
          --plot $R/offline.png; } > $R/offline.txt 2>&1
    grep -v "capturing" $R/offline.txt | tail -n 16 ;;
pdl)
    { host_speed
      echo "\$ python3 benchmark/h200/pdl_gemm.py --rows 16 64 128 256"
      timeout 330 python3 benchmark/h200/pdl_gemm.py --rows 16 64 128 256; } > $R/pdl.txt 2>&1
    cat $R/pdl.txt
    for tree in .dev/old .; do
        out=$R/timeline_b16_$([ $tree = . ] && echo now || echo s21).txt
        { host_speed
          echo "\$ python3 $tree/benchmark/timeline.py --device cuda --model $M --batch 16"
          PYTHONPATH=$tree/python:$PYTHONPATH timeout 90 python3 $tree/benchmark/timeline.py \
            --device cuda --model $M --batch 16; } > $out 2>&1
        grep -v "capturing" $out | tail -n 6
    done ;;
ab)
    for round in 1 2; do
        for tree in .dev/old .; do
            out=$R/timeline_b16_$([ $tree = . ] && echo now || echo s21)_$round.txt
            { host_speed
              echo "\$ python3 $tree/benchmark/timeline.py --device cuda --model $M --batch 16"
              PYTHONPATH=$tree/python:$PYTHONPATH timeout 90 python3 $tree/benchmark/timeline.py \
                --device cuda --model $M --batch 16; host_speed; } > $out 2>&1
            grep -E "host speed|重叠" $out
        done
    done ;;
b256)
    for round in 1 2; do
        { host_speed
          echo "\$ python3 benchmark/timeline.py --device cuda --model $M --batch 256"
          timeout 120 python3 benchmark/timeline.py --device cuda --model $M --batch 256 \
            --json $R/timeline_b256_$round.json; host_speed; } > $R/timeline_b256_$round.txt 2>&1
        grep -E "host speed|重叠" $R/timeline_b256_$round.txt
    done ;;
nofix)
    python3 tools/models.py --only tiny-qwen3 > /dev/null
    test=tests/test_cuda_graph_cuda.py::test_a_graph_less_engine_built_on_memory_another_left_behind
    { host_speed
      for tree in .dev/nofix .dev/nofix .dev/nofix .; do
          echo "\$ python3 -m pytest -q $tree/$test   # $tree"
          ([ $tree = . ] || ln -sfn $PWD/models $tree/models; cd $tree && PYTHONPATH=python:/tmp/site \
              timeout 100 python3 -m pytest -q -p no:cacheprovider $test 2>&1 | tail -n 4)
      done; } > $R/nofix.txt 2>&1
    cat $R/nofix.txt ;;
esac
