#!/usr/bin/env bash
# 2026-12-02, session 10's H200 calls against issue 26's ITL floor, each part a call and the
# two in a row on one warm machine. Run twice: at da10a80 (chapter 10's mixed batches: running
# requests ride in every prefill step), then with chapter 18's scheduler reading the batch in
# flight before it launches a prefill (the second pair, without prefill_host.py and with
# offline.py's PYTHONPATH, which the first pair lacked).
#   serving  this tree's server three times at 16 req/s and at rate inf, each side by side
#            with LLM.generate on the same requests (--compare-offline): the floors as the
#            median of three; first the host speed line, as in session8.sh.
#   offline  the server of a56a0b6 (the commit before mixed batches) once, the same command;
#            the official offline workload, three rounds, with this tree and with a56a0b6's
#            own offline.py (the first pair: then prefill_host.py, one eager 8,192-token
#            prefill step by op).
# Before the first call, here:  rm -rf .dev/old && mkdir -p .dev/old &&
#   git archive a56a0b6 python steps benchmark | tar -x -C .dev/old
# and carry [".whl", ".dev/smol-tok", ".dev/old"] both times (a call's carried paths are gone
# at the next). Results go straight to $OUT, so a run cut by the call's limit still returns.
set -uo pipefail
part=${1:?usage: session10.sh serving|offline}
source benchmark/h200/setup.sh
R=$OUT/s10-$part && mkdir -p $R
M=models/qwen3-0.6b-random
W="--device cuda --model $M --num-requests 400 --input-len 1024 --output-len 256"
case $part in
serving)
    host_speed > $R/host.txt 2>&1
    for i in 1 2 3; do
        timeout 170 python3 benchmark/online.py $W --rates 16 inf --compare-offline \
            --json $R/run$i.json > $R/run$i.txt 2>&1
    done
    cat $R/host.txt; grep -h -A4 "^下限" $R/run*.txt ;;
offline)
    timeout 170 python3 benchmark/online.py $W --rates 16 inf --compare-offline \
        --engine-path .dev/old/python --json $R/before.json > $R/before.txt 2>&1
    # offline.py imports minisgl from PYTHONPATH: each its own tree's
    PYTHONPATH=python:$PYTHONPATH timeout 150 python3 benchmark/offline.py --device cuda \
        --model $M --rounds 3 --skip-transformers > $R/offline_after.txt 2>&1
    PYTHONPATH=.dev/old/python:$PYTHONPATH timeout 150 python3 .dev/old/benchmark/offline.py \
        --device cuda --model $M --rounds 3 --skip-transformers > $R/offline_before.txt 2>&1
    grep -h -A4 "^下限" $R/before.txt; tail -n 5 $R/offline_*.txt ;;
esac
