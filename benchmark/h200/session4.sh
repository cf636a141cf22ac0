#!/usr/bin/env bash
# Chapter 21's runs that session3.sh could not fit: the official offline workload with the
# fa and torch attention backends, the clients' cost per chunk on this host, the kernel bench.
set -uo pipefail
source benchmark/h200/setup.sh
export PYTHONPATH=python:$PYTHONPATH
M=models/qwen3-0.6b-random
{ timeout 30 python3 benchmark/client_cost.py
  timeout 150 python3 benchmark/offline.py --device cuda --model $M --attn flashinfer fa torch \
      --skip-transformers
  timeout 80 python3 benchmark/kernel_bench.py; } > $OUT/chapter21.txt 2>&1
grep -v capturing $OUT/chapter21.txt | tail -n 40
