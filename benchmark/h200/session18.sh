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
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session18.sh probe}
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
esac
