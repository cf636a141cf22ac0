#!/usr/bin/env bash
# 2026-12-04, session 21's H200 calls on issue 27.
#   one     (run at a94908e: `git checkout a94908e`; later trees have no gemm.cu and no
#           --splits) The decode step's projections took cuBLAS 0.69-0.79 ms at every batch
#           size, about 3x what their weights and FLOPs need (ch21_gemm_shapes_s18); a94908e
#           gave chapter 19 its own GEMM for 5-256 rows (gemm.cu: split-K over all SMs, tensor
#           cores, weights loaded under PDL). It was slower everywhere and was taken out (ch19
#           "试过、没有留下的第三处"). A fresh machine, carry [".whl", ".dev/smol-tok",
#           ".dev/old"] (.dev/old: d8662af, `git archive d8662af python benchmark tools tests
#           steps | tar -x -C .dev/old`):
#           the GEMM's and GEMV's GPU tests; gemm_shapes.py with our column and a sweep of
#           split counts, the LM head too; decode_profile.py at batch 16 and 256, both trees.
#   two     a fresh machine, carry [".whl", ".dev/smol-tok"]: where the time between steps
#           goes on this host (0.24-0.52 s of the workload in sessions 19-20): roofline.py now
#           records the stream's idle time before every step, by phase; host_probe.py times
#           the garbage collector during the workload (and with gc.freeze()) and the final
#           detokenization.
#   ablate  a fresh machine, carry [".whl", ".dev/smol-tok"]: chapter 21's ablation table on this
#           tree (one round each, transformers last), as session12.sh's was at d1c15ee.
#   timeline the same warm machine, no carry: the overlap timeline at batch 256 and 16.
#   attn    a fresh machine, carry [".whl", ".dev/smol-tok"]: decode attention alone (one layer,
#           replayed back to back in a graph) against its share of a whole decode step
#           (decode_profile.py), the same uniform contexts of 700 tokens, batch 64, 128, 256:
#           does the kernel read slower inside the step than alone?
#   waves   a fresh machine, carry [".whl", ".dev/smol-tok"]: if what the step loses is the
#           attention's tail (the o projection after it cannot start early), shorter chunks
#           should lose less: decode_profile.py at batch 256 and 64 with the plan told that a
#           wave holds 1x, 2x, 4x the chunks it does (cuda_kernels.decode_attention_items_per_wave
#           scaled in the process, no library change).
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session21.sh one|two|ablate|timeline|attn|waves}
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
two)
    { host_speed; timeout 150 python3 benchmark/roofline.py --device cuda --model $M \
        --workload official --json $R/roofline.json; } > $R/roofline.txt 2>&1
    tail -n 22 $R/roofline.txt
    timeout 200 python3 benchmark/h200/host_probe.py --model $M > $R/host_probe.txt 2>&1
    tail -n 8 $R/host_probe.txt ;;
ablate)
    host_speed > $R/offline.txt
    timeout 480 python3 benchmark/offline.py --device cuda --model $M --attn flashinfer \
        --ablate overlap cuda-graph custom-kernels radix page-16 --json $R/offline.json \
        --plot $R/offline.png >> $R/offline.txt 2>&1
    tail -n 12 $R/offline.txt ;;
timeline)
    for b in 256 16; do
        { host_speed; timeout 120 python3 benchmark/timeline.py --device cuda --model $M \
            --batch $b --json $R/timeline_b$b.json; } > $R/timeline_b$b.txt 2>&1
        tail -n 8 $R/timeline_b$b.txt
    done ;;
attn)
    { host_speed; timeout 200 python3 benchmark/h200/decode_attention.py --graph \
        --batch 64 128 256 --context 700 --page-size 256; } > $R/attention.txt 2>&1
    cat $R/attention.txt
    for batch in 64 128 256; do
        timeout 100 python3 benchmark/decode_profile.py --attn flashinfer --batch $batch \
            --prompt-len 700 --page-size 256 --temperature 0.6 --top 4 > $R/profile_b$batch.txt 2>&1
        grep -h -A6 "batch  " $R/profile_b$batch.txt
    done ;;
waves)
    host_speed > $R/waves.txt
    for batch in 256 64; do
        for scale in 1 2 4; do
            echo "\$ decode_profile.py --batch $batch, items per wave x $scale" >> $R/waves.txt
            timeout 80 python3 -c "
import runpy, sys
sys.path.insert(0, 'benchmark')  # decode_profile.py imports its neighbours
from minisgl.kernel import cuda_kernels
per_wave = cuda_kernels.decode_attention_items_per_wave
cuda_kernels.decode_attention_items_per_wave = lambda *a: $scale * per_wave(*a)
sys.argv = ['decode_profile.py', '--attn', 'flashinfer', '--batch', '$batch', '--prompt-len',
            '700', '--page-size', '256', '--temperature', '0.6', '--top', '3']
runpy.run_path('benchmark/decode_profile.py', run_name='__main__')" 2>&1 \
                | grep -A5 "batch  " >> $R/waves.txt
        done
    done
    cat $R/waves.txt ;;
esac
