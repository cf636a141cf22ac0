#!/usr/bin/env bash
# The book's GPU measurements, part by part, on the current tree:
#
#     OUT=/some/folder bash benchmark/gpu/run.sh PART [PART ...]
#
# run from the repository root on a machine with an NVIDIA GPU (the book's: one H200). Each
# part writes its records under $OUT, named by topic (chNN_<topic>.<card>.txt: NN is the chapter
# whose page cites it, <card> h200 on the book's H200), each starting with a header: the date, the GPU and the host with its
# speed, the software versions, the part that made it, then every command as it ran. Several
# parts in one call run one after another on the same machine. What each part measures, the
# wheels and files to carry, and how long each part takes: benchmark/gpu/README.md.
set -uo pipefail

PARTS=(offline ablate decode serving timeline roofline kernels bandwidth profile host moe faults
       mains tests)
usage() { echo "usage: benchmark/gpu/run.sh PART [PART ...]   PART: ${PARTS[*]}" >&2; }
[ $# -ge 1 ] || { usage; exit 2; }
for part in "$@"; do
    case " ${PARTS[*]} " in
        *" $part "*) ;;
        *) echo "benchmark/gpu/run.sh: unknown part '$part'" >&2; usage; exit 2 ;;
    esac
done
: "${OUT:?benchmark/gpu/run.sh: set OUT to the folder the records go to}"
mkdir -p "$OUT" /tmp/gpu-json
cd "$(dirname "$0")/../.."
source benchmark/gpu/setup.sh

M=models/qwen3-0.6b-random
# Records are named after the card that made them (h200 for the book's), so a run on another card
# never passes for the book's: chNN_topic.h100.txt on an H100.
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | grep -oiE "[a-z][0-9]{2,3}" \
       | head -n 1 | tr "[:upper:]" "[:lower:]")
CARD=${CARD:-gpu}
PART=

# start NAME: the record $OUT/NAME begins with its header; `cmd` and `note` append to it.
start() { R=$OUT/$1; header "$PART" > "$R"; }
note() { echo "$*" >> "$R"; }
# cmd LIMIT COMMAND...: the command into the record ("$ ...", $OUT for the output folder), then
# its output, run under `timeout LIMIT` seconds. Progress lines rewritten with \r keep only what
# a terminal would show last. A command that fails or runs out of time says so in the record.
cmd() {
    local limit=$1; shift
    echo "\$ ${*//"$OUT"/\$OUT}" >> "$R"
    quiet "$limit" "$@"
}
# quiet LIMIT COMMAND...: as cmd, without the command line (the caller wrote its own).
quiet() {
    local limit=$1; shift
    timeout -k 10 "$limit" "$@" 2>&1 | sed -u 's/.*\r//' >> "$R"
    local status=${PIPESTATUS[0]}
    if [ "$status" != 0 ]; then
        echo "# exit status $status$([ "$status" = 124 ] && echo ": stopped after $limit s")" >> "$R"
    fi
    return "$status"
}
# show NAME LINES: the end of a record on the call's own output.
show() { echo "== $1"; grep -v "^capturing\|Warning\|warn(" "$OUT/$1" | tail -n "$2"; }
tiny_models() {
    python3 tools/models.py --only tiny-qwen3 --only tiny-llama --only tiny-qwen2 \
        --only tiny-mistral --only tiny-qwen3-moe > /tmp/gpu-models.txt 2>&1
}

part_offline() {  # chapter 21: the official offline workload, the official measure
    start ch21_offline.${CARD}.txt
    note "# 官方的量法：每个新进程计时一轮（--rounds 1），三个进程；然后 transformers 在同一个进程里与我们并排一次"
    local args=(--device cuda --model $M --attn flashinfer --rounds 1) n
    rm -f /tmp/gpu-json/offline_*.json
    for n in 1 2 3; do
        cmd $([ $n = 1 ] && echo 240 || echo 120) python3 benchmark/offline.py "${args[@]}" \
            --skip-transformers --json /tmp/gpu-json/offline_$n.json
    done
    python3 benchmark/gpu/median.py offline /tmp/gpu-json/offline_{1,2,3}.json >> "$R"
    cmd 420 python3 benchmark/offline.py "${args[@]}" --json "$OUT/ch21_offline.${CARD}.json"
    show ch21_offline.${CARD}.txt 12
}

part_ablate() {  # chapters 18 and 21: each feature off in turn, transformers in the same run
    start ch21_ablate.${CARD}.txt
    # overlap+cuda-graph: chapter 18's fourth corner (overlap with and without graphs)
    cmd 570 python3 benchmark/offline.py --device cuda --model $M --attn flashinfer \
        --ablate overlap cuda-graph overlap+cuda-graph custom-kernels radix page-16 \
        --json "$OUT/ch21_ablate.${CARD}.json" --plot "$OUT/ch21_ablate.${CARD}.png"
    show ch21_ablate.${CARD}.txt 12
}

part_decode() {  # chapters 18, 19 and 21: decode ms/step, with and without graphs and kernels
    # chapter 21: batch 1 and 32, three processes, transformers in the first
    start ch21_decode.${CARD}.txt
    local args=(--model $M --tp 1 --batch 1 32 --device cuda --attn flashinfer)
    cmd 300 python3 benchmark/tp_decode.py "${args[@]}" --transformers
    cmd 120 python3 benchmark/tp_decode.py "${args[@]}"
    cmd 120 python3 benchmark/tp_decode.py "${args[@]}"
    python3 benchmark/gpu/median.py decode "$R" >> "$R"
    # chapter 18: the same steps with and without CUDA graphs, in one process
    start ch18_decode.${CARD}.txt
    cmd 240 python3 benchmark/tp_decode.py --model $M --tp 1 --batch 1 32 256 --device cuda \
        --attn flashinfer --cuda-graph auto off
    # chapter 19: the same steps with and without its kernels, in one process
    start ch19_decode.${CARD}.txt
    cmd 180 python3 benchmark/tp_decode.py --model $M --tp 1 --batch 1 256 --device cuda \
        --attn flashinfer --custom-kernels auto off
    show ch21_decode.${CARD}.txt 6
    show ch18_decode.${CARD}.txt 8
    show ch19_decode.${CARD}.txt 6
}

part_serving() {  # chapter 15: the serving floors, the same command three times
    start ch15_serving_floors.${CARD}.txt
    local args=(--device cuda --model $M --num-requests 400 --input-len 1024 --output-len 256
                --rates 16 inf --compare-offline) n
    rm -f /tmp/gpu-json/serving_*.json
    for n in 1 2 3; do
        cmd 180 python3 benchmark/online.py "${args[@]}" --json /tmp/gpu-json/serving_$n.json
    done
    python3 benchmark/gpu/median.py serving /tmp/gpu-json/serving_{1,2,3}.json >> "$R"
    show ch15_serving_floors.${CARD}.txt 8
}

part_timeline() {  # chapter 21: the overlap scheduler's timeline at batch 256 and 16
    start ch21_timeline.${CARD}.txt
    local b
    for b in 256 16; do
        cmd 150 python3 benchmark/timeline.py --device cuda --model $M --batch $b \
            --json "$OUT/ch21_timeline_b$b.${CARD}.json" --plot "$OUT/ch21_timeline_b$b.${CARD}.png"
        note "# $(host_speed)"
    done
    show ch21_timeline.${CARD}.txt 16
}

part_roofline() {  # chapter 21: every step of the official workload against its bound
    start ch21_roofline.${CARD}.txt
    cmd 240 python3 benchmark/roofline.py --device cuda --model $M --workload official \
        --json "$OUT/ch21_roofline.${CARD}.json"
    show ch21_roofline.${CARD}.txt 14
}

part_kernels() {  # chapters 17 and 19: the kernels against what they replace
    start ch19_kernel_bench.${CARD}.txt
    cmd 150 python3 benchmark/kernel_bench.py --tokens 1 256 16384
    start ch17_decode_attention.${CARD}.txt
    cmd 150 python3 benchmark/gpu/decode_attention.py
    start ch19_decode_attention.${CARD}.txt
    cmd 150 python3 benchmark/gpu/decode_attention.py --graph --batch 1 2 4 8 16 32 \
        --context 1024 4096 --page-size 256
    cmd 150 python3 benchmark/gpu/decode_attention.py --mixed --batch 8 16 32 64 128 256
    start ch19_gemv_bench.${CARD}.txt
    cmd 90 python3 benchmark/gpu/gemv_bench.py
    start ch19_sample_bench.${CARD}.txt
    cmd 90 python3 benchmark/gpu/sample_bench.py
    # chapter 19: one decode step with and without its kernels at batch 1, again with PDL off
    # (MINISGL_PDL=0), and with and without them at batch 256 sampling at temperature 0.6
    start ch19_decode_profile.${CARD}.txt
    cmd 150 python3 benchmark/decode_profile.py --model $M --attn flashinfer --batch 1 \
        --custom-kernels auto off --top 25
    cmd 90 env MINISGL_PDL=0 python3 benchmark/decode_profile.py --model $M --attn flashinfer \
        --batch 1
    cmd 150 python3 benchmark/decode_profile.py --model $M --attn flashinfer --batch 256 \
        --prompt-len 700 --page-size 256 --temperature 0.6 --custom-kernels auto off --top 25
    local record
    for record in ch19_kernel_bench ch17_decode_attention ch19_decode_attention ch19_gemv_bench \
                  ch19_sample_bench ch19_decode_profile; do
        show $record.${CARD}.txt 8
    done
}

part_bandwidth() {  # chapters 19 and 21: how close the decode step's reads get to the memory's
    start ch21_read_speed.${CARD}.txt
    cmd 120 python3 benchmark/gpu/read_speed.py --batch 256 --context 718
    cmd 120 python3 benchmark/gpu/read_speed.py --batch 64 --context 710
    cmd 120 python3 benchmark/gpu/decode_attention.py --graph --batch 64 256 --context 710 718 \
        --page-size 256
    start ch21_gemm_shapes.${CARD}.txt
    cmd 120 python3 benchmark/gpu/gemm_shapes.py --no-triton --rows 16 64 128 256
    cmd 120 python3 benchmark/gpu/gemm_shapes.py --no-triton --rows 16 64 128 256 --hot
    start ch21_pdl_gemm.${CARD}.txt
    cmd 300 python3 benchmark/gpu/pdl_gemm.py --rows 16 64 128 256
    local record
    for record in ch21_read_speed ch21_gemm_shapes ch21_pdl_gemm; do show $record.${CARD}.txt 10; done
}

part_profile() {  # chapters 17, 18 and 21: where a decode step's and the workload's time goes
    # chapter 17: one eager decode step at batch 256, the torch backend against FlashInfer
    start ch17_decode_profile.${CARD}.txt
    cmd 180 python3 benchmark/decode_profile.py --model $M --attn torch flashinfer \
        --cuda-graph off --custom-kernels off
    start ch21_workload_profile.${CARD}.txt
    cmd 300 python3 benchmark/gpu/workload_profile.py --model $M --out /tmp/gpu-pyspy
    start ch21_attention_share.${CARD}.txt
    local b
    for b in 64 128 256; do  # one batch a process: each engine sizes its pool alone
        cmd 120 python3 benchmark/gpu/attention_share.py --model $M --batch $b
    done
    local record
    for record in ch17_decode_profile ch21_workload_profile ch21_attention_share; do
        show $record.${CARD}.txt 10
    done
}

part_host() {  # chapters 15, 18 and 21: the host's share of prefill steps and of a round
    start ch15_prefill_host.${CARD}.txt
    cmd 120 python3 benchmark/gpu/prefill_host.py --model $M
    start ch15_linear_shapes.${CARD}.txt
    cmd 60 python3 benchmark/gpu/linear_shapes.py
    cmd 60 env TORCH_BLAS_PREFER_CUBLASLT=1 python3 benchmark/gpu/linear_shapes.py
    start ch21_prefill_gaps.${CARD}.txt
    cmd 120 python3 benchmark/gpu/prefill_gaps.py --model $M --no-profiler
    cmd 120 python3 benchmark/gpu/prefill_gaps.py --model $M --no-profiler --cprofile 45
    start ch18_first_round.${CARD}.txt
    cmd 200 python3 benchmark/gpu/first_round.py --model $M
    start ch21_host_probe.${CARD}.txt
    cmd 200 python3 benchmark/gpu/host_probe.py --model $M
    local record
    for record in ch15_prefill_host ch15_linear_shapes ch21_prefill_gaps ch18_first_round \
                  ch21_host_probe; do
        show $record.${CARD}.txt 8
    done
}

part_moe() {  # chapter 20: one MoE layer, then a 12-layer Qwen3-30B-A3B-shaped model
    start ch20_moe_bench.${CARD}.txt
    cmd 180 python3 benchmark/moe_bench.py --tokens 1 64 256 4096 --sweep
    start ch20_moe_profile.${CARD}.txt
    cmd 120 python3 benchmark/moe_bench.py --tokens 1 --profile
    start ch20_offline_moe.${CARD}.txt
    # 16 GB of random weights, built once a machine (a later call on it finds them).
    cmd 400 python3 tools/models.py --only qwen3-moe-random \
        && cmd 300 python3 benchmark/offline.py --device cuda --model models/qwen3-moe-random \
            --attn flashinfer --skip-transformers
    local record
    for record in ch20_moe_bench ch20_moe_profile ch20_offline_moe; do show $record.${CARD}.txt 8; done
}

part_faults() {  # chapter 21: a step that faults on the GPU on purpose; a burst beyond the KV pool
    start ch21_device_fault.${CARD}.txt
    cmd 240 python3 benchmark/device_fault.py --device cuda --model $M --step 40
    start ch21_overload.${CARD}.txt
    # 2,000 requests of 512 + 64 tokens; 16,384 pages hold 28 of them at a time.
    cmd 480 python3 benchmark/overload.py --device cuda --model $M --requests 2000 \
        --input-len 512 --output-len 64 --num-pages 16384 --bounds 4096 100
    show ch21_device_fault.${CARD}.txt 16
    show ch21_overload.${CARD}.txt 8
}

part_mains() {  # chapters 17-20: each chapter's main, built on its own, on the GPU
    tiny_models
    smollm2_from_parts /tmp/gpu-models.txt \
        || echo "SmolLM2 is missing: the mains that use it will fail (README: three calls)"
    local slug  # MAINS="17 18" runs some of them (a fresh machine compiles for minutes)
    for slug in ch17_gpu_attention ch18_cuda_graph ch19_cuda_kernels ch20_moe; do
        [[ " ${MAINS:-17 18 19 20} " == *" ${slug:2:2} "* ]] || continue
        local n=${slug:2:2}
        start ${slug}_main.${CARD}.txt
        local dir=/tmp/gpu-mains/ch$n
        note "\$ python3 tools/steps.py build $n $dir && cd $dir && python3 main.py"
        rm -rf $dir
        quiet 300 bash -c "python3 tools/steps.py build $n $dir > /dev/null \
            && cd $dir && PYTHONPATH=.:/tmp/site python3 main.py"
        show ${slug}_main.${CARD}.txt 4
    done
}

part_tests() {  # the GPU test modules
    tiny_models
    smollm2_from_parts /tmp/gpu-models.txt \
        || echo "SmolLM2 is missing: the tests that use it skip (README: three calls)"
    start gpu_pytest.${CARD}.txt
    # -s: the tests print what they measure (errors against float32, the logit gap where two
    # backends' greedy tokens part), which the pages quote
    cmd 560 python3 -m pytest -v -s -rs --durations=10 -p no:cacheprovider \
        tests/test_tp_gpu.py tests/test_gpu_attention_cuda.py tests/test_cuda_graph_cuda.py \
        tests/test_cuda_kernels_cuda.py tests/test_fused_moe_cuda.py tests/test_overlap_gpu.py
    show gpu_pytest.${CARD}.txt 20
}

for PART in "$@"; do
    echo "=== benchmark/gpu/run.sh $PART ($(date -u +%H:%M:%S))"
    SECONDS=0
    part_$PART
    echo "=== $PART: ${SECONDS} s"
done
