#!/usr/bin/env bash
# Next session's first measurements, one call each on one warm machine (what issues 26 and 27
# left unmeasured on 2026-12-02):
#   serving  the two host savings of 2026-12-02 (chapter 17's append_host without a copy of the
#            sequence, chapter 13's faster codec) before and after, side by side: the same 400
#            requests at rate inf against the server of 5744383 (the commit before both) and of
#            this tree, each with --compare-offline; then this tree once more with --profile.
#   offline  the official workload, three rounds, and the overlap timeline at batch 256.
# Before the serving call, here:  rm -rf .dev/old && mkdir -p .dev/old &&
#   git archive 5744383 python steps | tar -x -C .dev/old
# and carry [".whl", ".dev/smol-tok", ".dev/old"] (python/ of .dev/old holds links into steps/).
set -uo pipefail
part=${1:?usage: session7.sh serving|offline}
source benchmark/h200/setup.sh
R=/tmp/s7-$part && mkdir -p $R
M=models/qwen3-0.6b-random
W="--device cuda --model $M --num-requests 400 --input-len 1024 --output-len 256 --rates inf"
case $part in
serving)
    timeout 170 python3 benchmark/online.py $W --compare-offline --engine-path .dev/old/python \
        --json $R/before.json > $R/before.txt 2>&1
    timeout 170 python3 benchmark/online.py $W --compare-offline --json $R/after.json \
        > $R/after.txt 2>&1
    timeout 170 python3 benchmark/online.py $W --profile $R/prof > $R/profile.txt 2>&1 ;;
offline)
    export PYTHONPATH=python:$PYTHONPATH
    timeout 300 python3 benchmark/offline.py --device cuda --model $M --rounds 3 \
        --skip-transformers > $R/offline.txt 2>&1
    timeout 150 python3 benchmark/timeline.py --device cuda --model $M --batch 256 \
        --json $R/timeline.json > $R/timeline.txt 2>&1 ;;
esac
tar czf $OUT/session7-$part.tgz -C /tmp s7-$part
tail -n 6 $R/*.txt
