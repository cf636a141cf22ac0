#!/usr/bin/env bash
# 2026-12-04, session 24's H200 calls on issue 27.
#   probe   a fresh machine, carry [".whl", ".dev/smol-tok"]: how fast a kernel can read a
#           decode layer's K/V here (read_speed.py: three read orders, torch's copy) next to
#           chapter 19's decode attention on the same batch and context
#           (decode_attention.py --graph); chapter 18's GPU tests, not run since the warm-up
#           moved into the engine's constructor (454c12e).
#   tiles   a fresh machine, carry [".whl", ".dev/smol-tok", ".dev/t63", ".dev/t54", ".dev/t83"]
#           (each `git archive HEAD python steps benchmark` with decode_attention.cu's kTile and
#           kMinBlocks for bfloat16 set to 6/3, 5/4, 8/3: more K/V bytes in flight per SM, fewer
#           blocks or a few spilled registers; 4/4 is this tree's): chapter 19's decode
#           attention, uniform contexts of 710 (batch 16-256) and the official workload's mixed
#           ones, each tree in its own process.
#   ablate  a fresh machine, carry [".whl", ".dev/smol-tok"]: chapter 21's ablation table on this
#           tree (every default, then each feature off in turn, transformers last), one call.
#   repro   the ablation's third engine (CUDA graphs off) hit an illegal memory access in its
#           warm-up prefill. Three calls, each on a fresh machine, the script changing in
#           between (its commits say how): (1) one engine a fresh process, graphs off (with
#           CUDA_LAUNCH_BLOCKING=1), graphs and custom kernels off, the default: all fine;
#           offline.py --ablate cuda-graph: the fault again; (2) two engines a process, under
#           CUDA_LAUNCH_BLOCKING=1: no fault (that script kept the first engine alive, so the
#           second found 401 pages); (3) as it stands: offline.py --ablate cuda-graph with the
#           warm-up saying what it is about to do, without and with CUDA_LAUNCH_BLOCKING=1
#           (fault, no fault: a race), then graphs off alone in a fresh process (no fault).
#   ablate2 a fresh machine, the same carry, after the fix (the engine's constructor waits for
#           its default-stream work): the ablation table again, without transformers (the
#           device time left would not hold its 206 s).
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session24.sh probe|tiles|ablate|repro|ablate2}
source benchmark/h200/setup.sh
R=$OUT/s24-$part && mkdir -p $R
export PYTHONPATH=python:$PYTHONPATH
M=models/qwen3-0.6b-random
case $part in
probe)
    { host_speed
      for shape in "256 718" "64 710"; do
          set -- $shape
          echo "\$ python3 benchmark/h200/read_speed.py --batch $1 --context $2"
          timeout 150 python3 benchmark/h200/read_speed.py --batch $1 --context $2
      done
      echo "\$ python3 benchmark/h200/decode_attention.py --graph --batch 64 256 --context 710 718 --page-size 256"
      timeout 150 python3 benchmark/h200/decode_attention.py --graph --batch 64 256 \
          --context 710 718 --page-size 256
    } > $R/read_speed.txt 2>&1
    cat $R/read_speed.txt
    python3 tools/models.py --only tiny-qwen3 > /dev/null
    timeout 100 python3 -m pytest -q -rs tests/test_cuda_graph_cuda.py > $R/tests.txt 2>&1
    tail -n 4 $R/tests.txt ;;
tiles)
    host_speed > $R/tiles.txt
    for tree in . .dev/t63 .dev/t54 .dev/t83; do
        { echo "\$ python3 $tree/benchmark/h200/decode_attention.py --graph --batch 16 64 128 256 --context 710 --page-size 256"
          timeout 120 python3 $tree/benchmark/h200/decode_attention.py --graph \
              --batch 16 64 128 256 --context 710 --page-size 256
          echo "\$ python3 $tree/benchmark/h200/decode_attention.py --mixed --batch 16 64 128 256"
          timeout 120 python3 $tree/benchmark/h200/decode_attention.py --mixed \
              --batch 16 64 128 256
        } >> $R/tiles.txt 2>&1
    done
    cat $R/tiles.txt ;;
ablate)
    { host_speed
      echo "\$ python3 benchmark/offline.py --device cuda --model $M --attn flashinfer --ablate overlap cuda-graph custom-kernels radix page-16"
      timeout 540 python3 benchmark/offline.py --device cuda --model $M --attn flashinfer \
          --ablate overlap cuda-graph custom-kernels radix page-16 --json $R/offline.json \
          --plot $R/offline.png; } > $R/offline.txt 2>&1
    grep -v "capturing" $R/offline.txt | tail -n 14 ;;
repro)
    args="--device cuda --model $M --attn flashinfer --skip-transformers"
    for blocking in 0 1; do
        echo "\$ CUDA_LAUNCH_BLOCKING=$blocking python3 benchmark/h200/repro_warm_up.py $args --ablate cuda-graph"
        CUDA_LAUNCH_BLOCKING=$blocking timeout 150 python3 benchmark/h200/repro_warm_up.py $args \
            --ablate cuda-graph 2>&1 | grep -v "capturing" | tail -n 40
    done > $R/repro.txt 2>&1
    echo "\$ python3 -c 'LLM(page_size=256, cuda_graph=\"off\") in a fresh process'" >> $R/repro.txt
    timeout 100 python3 -c "
import torch
from minisgl.llm import LLM
from minisgl.core import SamplingParams
llm = LLM('$M', dtype=torch.bfloat16, max_running_req=256, page_size=256, cuda_graph='off')
print('built', llm.backend.scheduler.engine.num_pages, 'pages')
print(llm.generate([[1, 2, 3] * 20], SamplingParams(max_tokens=4, ignore_eos=True))[0]['token_ids'])
" 2>&1 | tail -n 6 >> $R/repro.txt
    cat $R/repro.txt ;;
ablate2)
    { host_speed
      echo "\$ python3 benchmark/offline.py --device cuda --model $M --attn flashinfer --ablate overlap cuda-graph custom-kernels radix page-16 --skip-transformers"
      timeout 320 python3 benchmark/offline.py --device cuda --model $M --attn flashinfer \
          --ablate overlap cuda-graph custom-kernels radix page-16 --skip-transformers \
          --json $R/offline.json; } > $R/offline.txt 2>&1
    grep -v "capturing" $R/offline.txt | tail -n 16 ;;
esac
