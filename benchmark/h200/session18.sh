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
# probe2 showed (ch21_gemm_shapes_s18, ch21_workload_profile_s18): cuBLAS 3.6-7.0 us a
# projection with the weight in the L2 against 4.9-8.1 from memory, so prefetching weights
# would win little; the prefill's host 62% busy (F.linear's host side 31 us a call); sampling
# 0.157 -> 0.132 ms a step at batch 256. Then chapter 19's decode attention took over the
# layer's q/k-norm and RoPE (core.Rotation): 28 launches a step less.
#   measure  a fresh machine, carry [".whl", ".dev/smol-tok", ".dev/old", ".dev/smollm2-1"]
#            (.dev/old: b4f24ec): the kernel GPU tests (the rotation against qk_norm_rope);
#            decode at batch 256 and 1 profiled, both trees; the official workload three rounds
#            each, this tree and the tree before.
# measure showed (book/runs/ch19_rotation_s18.h200.txt): at batch 256 the step's GPU time 6.89
# -> 6.85 ms (norm/RoPE 0.30 -> 0.21, attention 5.47 -> 5.53: every block of a request
# rotates its queries again), at batch 1 1.18 -> 1.25 (the table's loads after the wait); the
# workload 5.687 -> 5.663 s (medians), under the noise between rounds. Taken out again
# (the tree is b886c12's): what stays is the sampler's logarithm and the libraries looked up
# once.
#   final    a fresh machine, carry [".whl", ".dev/smol-tok", ".dev/old", ".dev/smollm2-1"]:
#            the official workload three rounds each, this tree and b4f24ec; tp_decode.py at
#            batch 1 three processes (transformers in the first).
#   carry    the same warm machine, carry [".dev/smollm2-2"]: only the copy of the wheel's part.
#   tests    the same warm machine, carry [".dev/smollm2-3"]: SmolLM2 built from its wheel, the
#            GPU tests that run it (its greedy tokens with and without our kernels, five
#            requests through our attention, the GEMV's decode).
#   finish   (not run: the session's device time was spent) the roofline.
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session18.sh probe|probe2|measure|final|carry|finish|tests}
source benchmark/h200/setup.sh
R=$OUT/s18-$part && mkdir -p $R
export PYTHONPATH=python:$PYTHONPATH
M=models/qwen3-0.6b-random
OLD="env PYTHONPATH=.dev/old/python:$PYTHONPATH python3 .dev/old/benchmark"  # the tree before
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
measure)
    host_speed > $R/host.txt 2>&1
    cat $R/host.txt
    timeout 150 python3 -m pytest -q -rs tests/test_cuda_kernels_cuda.py \
        -k "decode_attention or qk_norm_rope or gemv_matches" > $R/pytest_kernel.txt 2>&1
    tail -n 3 $R/pytest_kernel.txt
    # The first FlashInfer run on a fresh machine builds its kernels (JIT, about 70 s).
    for b in 256 1; do
        profile="--model $M --attn flashinfer --batch $b --prompt-len 700 --page-size 256 \
            --temperature 0.6 --top 12"
        timeout 100 python3 benchmark/decode_profile.py $profile > $R/profile_b$b.txt 2>&1
        timeout 100 $OLD/decode_profile.py $profile > $R/profile_b${b}_before.txt 2>&1
        grep -h -A1 "^ *batch " $R/profile_b${b}.txt $R/profile_b${b}_before.txt
    done
    args="--device cuda --model $M --attn flashinfer --rounds 3 --skip-transformers"
    timeout 120 python3 benchmark/offline.py $args --json $R/offline_after.json \
        > $R/offline_after.txt 2>&1
    timeout 120 $OLD/offline.py $args --json $R/offline_before.json > $R/offline_before.txt 2>&1
    tail -n 3 $R/offline_*.txt ;;
final)
    host_speed > $R/host.txt 2>&1
    cat $R/host.txt
    args="--device cuda --model $M --attn flashinfer --rounds 3 --skip-transformers"
    # The first FlashInfer run on a fresh machine builds its kernels (JIT, about 70 s).
    timeout 170 python3 benchmark/offline.py $args --json $R/offline_after.json \
        > $R/offline_after.txt 2>&1
    timeout 120 $OLD/offline.py $args --json $R/offline_before.json > $R/offline_before.txt 2>&1
    tail -n 3 $R/offline_*.txt
    decode="--model $M --tp 1 --batch 1 --device cuda --attn flashinfer"
    timeout 100 python3 benchmark/tp_decode.py $decode --transformers > $R/tp_decode.txt 2>&1
    for n in 2 3; do
        timeout 60 python3 benchmark/tp_decode.py $decode >> $R/tp_decode.txt 2>&1
    done
    grep -h "^measured\|transformers" $R/tp_decode.txt | head ;;
carry) ;;  # setup.sh keeps the carried part
finish)
    timeout 100 python3 benchmark/roofline.py --device cuda --model $M --workload official \
        --json $R/roofline.json > $R/roofline.txt 2>&1
    tail -n 9 $R/roofline.txt ;;
tests)
    smollm2_from_parts $R/models.txt
    tail -n 3 $R/models.txt
    timeout 150 python3 -m pytest -q -rs tests/test_cuda_kernels_cuda.py \
        -k "same_greedy or five_requests or gemv_decode" > $R/pytest_gpu.txt 2>&1
    tail -n 12 $R/pytest_gpu.txt ;;
esac
