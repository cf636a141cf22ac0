#!/usr/bin/env python3
"""第 20 章的小例子：6 个 token、每个选 2 个专家、4 个专家、BLOCK_M = 4，路由和对齐都由仓库自己的
函数算出（moe/base.py 的 select_experts，kernel/fused_moe.py 的 align_by_expert），在 CPU 上运行。
书里的图和表用的就是这里打印的数字（book/runs/ch20_align_example.txt）。

    python tools/moe_align_example.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from minisgl.kernel.fused_moe import align_by_expert  # noqa: E402
from minisgl.moe.base import select_experts  # noqa: E402

TOKENS, TOP_K, EXPERTS, BLOCK_M = 6, 2, 4, 4
SEED = 23  # a routing where one expert gets no pair and one gets more than a block


def main() -> None:
    router_logits = torch.randn(TOKENS, EXPERTS, generator=torch.Generator().manual_seed(SEED))
    _, topk_ids = select_experts(router_logits, TOP_K, renormalize=True)
    sorted_pairs, block_expert, padded_len = align_by_expert(topk_ids, EXPERTS, BLOCK_M)
    num_pairs = topk_ids.numel()

    print(f"{TOKENS} 个 token，top-{TOP_K}，{EXPERTS} 个专家，BLOCK_M = {BLOCK_M}（路由 logits："
          f"torch.randn，种子 {SEED}）")
    print("每个 token 选的专家（对 p = token × top_k + 第几个选择）：")
    for t, ids in enumerate(topk_ids.tolist()):
        pairs = ", ".join(f"对 {t * TOP_K + s} → 专家 {e}" for s, e in enumerate(ids))
        print(f"  token {t}: {pairs}")
    counts = torch.bincount(topk_ids.flatten(), minlength=EXPERTS)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    print(f"每个专家拿到的对：{counts.tolist()}，补齐到 BLOCK_M 的倍数：{padded.tolist()}")
    print(f"sorted_pairs（{len(sorted_pairs)} 行，按最坏情况分配；哨兵 = {num_pairs}）：")
    rows = sorted_pairs.tolist()
    for b, expert in enumerate(block_expert.tolist()):
        block = rows[b * BLOCK_M:(b + 1) * BLOCK_M]
        if expert < 0:
            print(f"  块 {b}: {block}  → -1：不用")
            continue
        token_rows = ["—" if p == num_pairs else str(p // TOP_K) for p in block]
        print(f"  块 {b}: {block}  → 专家 {expert}，读 token 行 [{', '.join(token_rows)}]")
    print(f"padded_len = {int(padded_len)}：前 {int(padded_len) // BLOCK_M} 块有活，"
          f"其余的程序读到 -1 就返回")


if __name__ == "__main__":
    main()
