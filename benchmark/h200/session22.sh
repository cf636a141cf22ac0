#!/usr/bin/env bash
# 2026-12-04, session 22's H200 calls on issue 27.
#   probe   a fresh machine, carry [".whl", ".dev/smol-tok"]: prefill_gaps.py (what the host
#           does while the GPU waits in the official workload's prefill steps: about 0.2 s of
#           the run by the roofline's record) and attention_share.py (decode attention's cost
#           inside the step's graph, no profiler, against the kernel alone on the same
#           contexts: session 21 saw 7-11% more under the profiler).
# Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session22.sh probe}
source benchmark/h200/setup.sh
R=$OUT/s22-$part && mkdir -p $R
export PYTHONPATH=python:$PYTHONPATH
M=models/qwen3-0.6b-random
case $part in
probe)
    { host_speed; timeout 200 python3 benchmark/h200/prefill_gaps.py --model $M; } \
        > $R/prefill_gaps.txt 2>&1
    grep -v "^USDT\|Warning\|warn(" $R/prefill_gaps.txt
    { host_speed; timeout 330 python3 benchmark/h200/attention_share.py --model $M; } \
        > $R/attention_share.txt 2>&1
    cat $R/attention_share.txt ;;
esac
