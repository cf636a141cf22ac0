#!/usr/bin/env bash
# 2026-12-03, session 18's H200 calls on issue 27. The official workload takes 5.73 s
# (ch21_offline_s17), 1.26 s more than 30,000 tok/s allows; its roofline (ch21_roofline_s17)
# puts about 1.4 ms above the copy-speed bound on every decode step at batch 9-256 and 0.25 s
# on the prefill. Before changing anything: how much of the wall time is the GPU idle, and is
# that the host?
#   probe  a fresh machine, carry [".whl", ".dev/smol-tok"]:
#          - workload_profile.py: the workload plain, under py-spy (the host's functions), under
#            the profiler (GPU busy, time by category, idle gaps by length), and its prefill
#            alone under the profiler (each run with fresh token ids: no radix hit);
#          - timeline.py at batch 64 and 128: the host's work a step against the GPU's, with
#            overlap scheduling, where the steps are shorter than at 256.
# The probe showed (book/runs/ch21_workload_profile_s18.h200.txt): the GPU busy 91% of the
# workload; idle 0.15 s in gaps under 5 us (kernel boundaries) and 0.2 s in longer ones; the
# prefill alone 63% busy (0.29 of 0.46 s), its gaps 50-500 us: the host launching the eager
# prefill is slower than the GPU. Timeline: at batch 64 the host's launch (2.5 ms) is the step.
#   probe2  a fresh machine, carry [".whl", ".dev/smol-tok", ".dev/old"] (.dev/old: b4f24ec,
#           `git archive b4f24ec python benchmark tools tests steps | tar -x -C .dev/old`):
#          - gemm_shapes.py, cuBLAS only, weights hot in the L2 against cycled through memory:
#            is a projection's 5-8 us the memory (then prefetching weights would pay) or not;
#          - workload_profile.py again, now with five prefill-only runs under py-spy: where the
#            host's prefill time goes (kernel libraries now looked up once, not per call);
#          - decode_profile.py at batch 256, temperature 0.6, both trees: the sampler with the
#            hardware's logarithm for the outer of its two.
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session18.sh probe|probe2}
source benchmark/h200/setup.sh
R=$OUT/s18-$part && mkdir -p $R
export PYTHONPATH=python:$PYTHONPATH
M=models/qwen3-0.6b-random
case $part in
probe)
    host_speed > $R/host.txt 2>&1
    cat $R/host.txt
    # The first FlashInfer run on a fresh machine builds its kernels (JIT, about 70 s).
    timeout 330 python3 benchmark/h200/workload_profile.py --model $M --out $R \
        > $R/workload.txt 2>&1
    cat $R/workload.txt
    for b in 64 128; do
        timeout 90 python3 benchmark/timeline.py --device cuda --model $M --batch $b \
            --json $R/timeline_b$b.json > $R/timeline_b$b.txt 2>&1
        tail -n 6 $R/timeline_b$b.txt
    done ;;
probe2)
    host_speed > $R/host.txt 2>&1
    cat $R/host.txt
    for temperature in hot cold; do
        timeout 100 python3 benchmark/h200/gemm_shapes.py --no-triton --rows 16 64 128 256 \
            $([ $temperature = hot ] && echo --hot) > $R/gemm_$temperature.txt 2>&1
        cat $R/gemm_$temperature.txt
    done
    # The first FlashInfer run on a fresh machine builds its kernels (JIT, about 70 s).
    timeout 330 python3 benchmark/h200/workload_profile.py --model $M --out $R \
        > $R/workload.txt 2>&1
    cat $R/workload.txt
    profile="--model $M --attn flashinfer --batch 256 --prompt-len 700 --page-size 256 \
        --temperature 0.6 --top 12"
    timeout 120 python3 benchmark/decode_profile.py $profile > $R/profile_b256.txt 2>&1
    PYTHONPATH=.dev/old/python:$PYTHONPATH timeout 120 python3 .dev/old/benchmark/decode_profile.py \
        $profile > $R/profile_b256_before.txt 2>&1
    grep -h -A3 "batch " $R/profile_b256*.txt | head -20 ;;
esac
