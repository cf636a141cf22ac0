"""第 19 章：我们自己的 CUDA kernel。

一、构建：同一份 .cu 源码，nvcc 为 sm_80、sm_90 各编译一次（有 nvcc 时）；C++ 编译器把它编成
    CPU 上的模拟器（csrc/cuda_model.h 把网格、线程块、共享内存和 __syncthreads 换成循环和纤程）；
二、六个 kernel 对参考算子：KV 写入、带词表切片掩码的 gather、Qwen3 的 q/k RMSNorm + RoPE、
    一遍读完 logits 的采样（Gumbel-max）、几行输入的矩阵乘（GEMV，及其门控版：gate_up 投影连同激活）、
    切成几段再合并的 decode 注意力（顺带写入新 token 的 K、V）。CPU 上跑模拟器，GPU 上跑真的 kernel；
三、整个模型：tiny-qwen3（有 q/k norm）和 SmolLM2 走这些 kernel 生成，与参考算子逐 token 相同，
    CPU 上（float32）还与 transformers 相同。
"""

import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.kernel import apply_rotary_inplace, cuda_kernels, jit, rms_norm, silu_and_mul
from minisgl.llm import LLM

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
PROMPTS = ["The capital of France is", "List three colors:", "def fibonacci(n):",
           "The sun rises in the"]
MAX_TOKENS = 12


def build(cuda: bool) -> None:
    if jit.nvcc_path() is None:
        print("  没有 nvcc：跳过 sm_80 / sm_90 的编译检查")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for name in jit.KERNELS:
                sizes = []
                for arch in ("sm_80", "sm_90"):
                    obj = Path(tmp) / f"{name}-{arch}.o"
                    jit.run_compiler(jit.compile_command(name, "cuda-object", obj, arch))
                    sizes.append(f"{arch} {obj.stat().st_size:,} 字节")
                print(f"  nvcc {name}.cu：{'，'.join(sizes)}")
    start = time.perf_counter()
    cuda_kernels.prepare(torch.device("cuda" if cuda else "cpu"))
    kind = "GPU 上的库" if cuda else "CPU 模拟器"
    print(f"  {kind}：{len(jit.KERNELS)} 个，{time.perf_counter() - start:.1f} 秒（已编译的从缓存取）")


def check_kernels(device: str, dtype: torch.dtype) -> bool:
    gen = torch.Generator().manual_seed(0)
    ok = True
    # KV 写入：5 个 token，K、V 是融合投影的列切片；其中一个写到池子的最后一个槽位
    qkv = torch.randn(5, 16 * 64, generator=gen).to(device, dtype)
    k, v = qkv[:, 8 * 64:12 * 64].view(5, 4, 64), qkv[:, 12 * 64:].view(5, 4, 64)
    out_loc = torch.tensor([99, 3, 42, 0, 17], device=device)
    k_cache, v_cache = (torch.zeros(100, 4, 64, device=device, dtype=dtype) for _ in range(2))
    cuda_kernels.store_kv(k_cache, v_cache, out_loc, k, v)
    same = torch.equal(k_cache[out_loc], k) and torch.equal(v_cache[out_loc], v)
    same &= int((k_cache.abs().sum((1, 2)) > 0).sum()) <= 5
    print(f"  store_kv：与 k_cache[out_loc] = k 逐位相同：{same}")
    ok &= same
    # gather：这个 rank 持有词表的第 [3, 8) 行，越界的 id 得到全零行
    weights = torch.randn(5, 64, generator=gen).to(device, dtype)
    ids = torch.tensor([3, 7, 0, 8, -1, 5], device=device)
    got = cuda_kernels.masked_gather(weights, ids, (3, 5))
    local = ids - 3
    want = weights[local.clamp(0, 4)] * ((local >= 0) & (local < 5))[:, None].to(dtype)
    same = got is not None and torch.equal(got, want)
    print(f"  masked_gather：与参考逐位相同（含 3 个越界 id）：{same}")
    ok &= same
    # q/k RMSNorm + RoPE：head_dim 128，4 个 query 头、2 个 KV 头，原地改写融合投影的列切片
    qkv = torch.randn(5, 8 * 128, generator=gen).to(device, dtype)
    q, k = qkv[:, :512], qkv[:, 512:768]
    weight_q, weight_k = ((torch.rand(128, generator=gen) + 0.5).to(device, dtype)
                          for _ in range(2))
    inv_freq = 1.0 / 10000 ** (torch.arange(0, 128, 2).float() / 128)
    angles = torch.outer(torch.arange(64, dtype=torch.float), inv_freq)
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)
    positions = torch.tensor([0, 5, 63, 7, 1], device=device)
    # 参考算子在 CPU 上算：GPU 上的 rms_norm 走 FlashInfer，它比 transformers 少取整一次（第 17 章）
    want_q = rms_norm(q.cpu().reshape(5, 4, 128), weight_q.cpu(), 1e-6).flatten(1)
    want_k = rms_norm(k.cpu().reshape(5, 2, 128), weight_k.cpu(), 1e-6).flatten(1)
    apply_rotary_inplace(positions.cpu(), want_q, want_k, 128, cache.cpu())
    cuda_kernels.qk_norm_rope(positions, q, k, 128, weight_q, weight_k, 1e-6, cache)
    # 两边在同样的位置取整，取整前的 float32 算术（求和顺序、FMA）却可能不同，结果差一个最低位：
    # bfloat16 有 8 位有效数字，一步是数值的 2**-7 倍左右，所以误差相对于数值来量（|参考| < 1 时按绝对）
    got, want = torch.cat([q, k], 1).cpu().float(), torch.cat([want_q, want_k], 1).float()
    error = ((got - want).abs() / want.abs().clamp(min=1)).max().item()
    tolerance = 1e-5 if dtype == torch.float32 else 2 ** -7
    print(f"  qk_norm_rope：与参考的最大相对误差 {error:.2e}（容差 {tolerance:g}）")
    ok &= error <= tolerance
    # 采样：同一行 logits 复制 n 份，按 T = 0.7 各抽一次，每个 token 的次数应在 softmax(logits / T)
    # 给出的期望的 4 个标准差以内（模拟器每个线程块起 256 个线程，CPU 上只抽 32 次）；温度 0 的行就是 argmax
    n = 4096 if device == "cuda" else 32
    row = torch.tensor([1.0, 0.5, -0.3, 2.0, 0.0, -1.5, 0.7, 1.2]).to(device, dtype)
    temperatures = torch.full((n,), 0.7, device=device)
    tokens = cuda_kernels.sample(row.expand(n, 8).contiguous(), temperatures, seed=0, draw=0)
    counts = torch.bincount(tokens.long().cpu(), minlength=8).float()
    expected = n * torch.softmax(row.float().cpu() / 0.7, dim=-1)
    within = bool(((counts - expected).abs() <= 4 * (expected * (1 - expected / n)).sqrt()).all())
    logits = torch.randn(4, 1000, generator=gen).to(device, dtype)
    greedy = cuda_kernels.sample(logits, torch.zeros(4, device=device), seed=0, draw=0)
    argmax = greedy is not None and torch.equal(greedy.long(), logits.argmax(dim=-1))
    print(f"  sample：{n} 次抽取，各 token 的次数在期望的 4σ 以内：{within}；"
          f"温度 0 的行等于 argmax：{argmax}")
    ok &= within and argmax
    # GEMV：4 行 bfloat16 输入乘 2,056 列宽的权重（每行拆给 4 个 warp），与 float64 的参考比；
    # 求和的顺序不同、最后取整一次：误差在 bfloat16 的一个最低位以内
    x = torch.randn(4, 2056, generator=gen).to(device, torch.bfloat16)
    w = (torch.randn(40, 2056, generator=gen) / 2056 ** 0.5).to(device, torch.bfloat16)
    got = cuda_kernels.gemv(x, w)
    want = x.double() @ w.double().T
    error = ((got.double() - want).abs() / want.abs().clamp(min=1)).max().item()
    print(f"  gemv：4 行 × 40 列，与参考的最大相对误差 {error:.2e}（容差 {2 ** -7:g}）")
    ok &= error <= 2 ** -7
    # 门控的 GEMV：同一个权重当作 [gate; up]（各 20 行），输出 silu(x·gate) * (x·up)，对照矩阵乘 + 激活两个参考算子
    got = cuda_kernels.gemv(x, w, gated=True)
    want = silu_and_mul(torch.nn.functional.linear(x, w)).float()
    error = ((got.float() - want).abs() / want.abs().clamp(min=1)).max().item()
    print(f"  gemv（门控）：4 行 × 20 列，与矩阵乘 + 激活的最大相对误差 {error:.2e}（容差 {2 ** -6:g}）")
    ok &= error <= 2 ** -6
    # decode 注意力：2 个请求（上下文 37、5 个 token），4 个 query 头共用 2 个 KV 头；先做 plan（一波 4 段、
    # 每段至少 8 个 token：37 个 token 切 3 段），再算注意力。新 token 的 K、V 取自投影（它的槽位里原来是
    # 别的数），kernel 顺带把它们写进池子
    k_cache, v_cache = (torch.randn(100, 2, 64, generator=gen).to(device, dtype) for _ in range(2))
    page_table = torch.randperm(100, generator=gen)[:80].view(2, 40).int().to(device)
    rows, positions = torch.tensor([1, 0], device=device), torch.tensor([36, 4], device=device)
    qkv = torch.randn(2, 8 * 64, generator=gen).to(device, dtype)
    q, k, v = (part.view(2, -1, 64) for part in qkv.split([256, 128, 128], dim=-1))
    out_loc = page_table[rows, positions].long()
    want = []
    for i in range(2):
        cached = page_table[rows[i], :positions[i]].long()
        keys = torch.cat([k_cache[cached], k[i:i + 1]]).double().repeat_interleave(2, 1)
        values = torch.cat([v_cache[cached], v[i:i + 1]]).double().repeat_interleave(2, 1)
        weights = (torch.einsum("hd,thd->ht", q[i].double(), keys) / 8).softmax(-1)
        want.append(torch.einsum("ht,thd->hd", weights, values))
    scratch = cuda_kernels.decode_attention_scratch(2, 4, 4, 2, 64, torch.device(device))
    assert cuda_kernels.decode_attention_plan(positions, 4, scratch, min_chunk=8)
    chunks = int(scratch[2][0])
    got = cuda_kernels.decode_attention(q, k, v, k_cache, v_cache, page_table, rows, positions,
                                        out_loc, 1 / 8, 4, scratch)
    want = torch.stack(want)
    error = ((got.double() - want).abs() / want.abs().clamp(min=1)).max().item()
    stored = torch.equal(k_cache[out_loc], k) and torch.equal(v_cache[out_loc], v)
    print(f"  decode_attention：2 个请求，plan 切成 {chunks} 段，与参考的最大相对误差 {error:.2e}"
          f"（容差 {tolerance:g}）；"
          f"新 K、V 已写入：{stored}")
    return ok and error <= tolerance and stored


def generate(path: Path, mode: str, dtype: torch.dtype) -> list[list[int]]:
    llm = LLM(str(path), dtype=dtype, custom_kernels=mode, max_running_req=4,
              num_page_override=256, max_seq_len_override=64)
    try:
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True),
                            progress=False)
    finally:
        llm.shutdown()
    return [o["token_ids"] for o in outs]


def hf_greedy(path: Path) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    outs = []
    for p in PROMPTS:
        ids = tokenizer(p, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None)
        outs.append(out[0, ids.shape[1]:].tolist())
    return outs


def main() -> int:
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    mode = "auto" if cuda else "emulate"
    print("一、构建：")
    build(cuda)
    print(f"\n二、kernel 对参考算子（{'GPU' if cuda else 'CPU 模拟器'}，"
          f"{str(dtype).removeprefix('torch.')}）：")
    previous = cuda_kernels.set_mode(mode)
    try:
        ok = check_kernels(device, dtype)
    finally:
        cuda_kernels.set_mode(previous)
    print(f"\n三、整个模型（custom_kernels={mode} 对 off）：")
    for name in ("tiny-qwen3", "SmolLM2-135M-Instruct"):
        path = MODELS / name
        ours = generate(path, mode, dtype)
        same = ours == generate(path, "off", dtype)
        print(f"  {name}：与参考算子逐 token 相同：{same}")
        ok &= same
        if not cuda:
            same = ours == hf_greedy(path)
            print(f"  {name}：与 transformers 逐 token 相同：{same}")
            ok &= same
    print("\n通过" if ok else "\n未通过")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
