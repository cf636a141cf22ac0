"""benchmark/moe_bench.py --profile on a CPU: its kernel table, with the fused MoE's kernels run in
Triton's interpreter and the CPU's operators standing in for the GPU's kernels."""

from __future__ import annotations

import pytest
import torch

from benchmark_scripts import load_script
from triton_helpers import fused_moe_kernels

CHAPTER = None  # repository tooling (moe_bench imports chapter 21's timing helpers): `make test`

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="the CPU path; on a GPU the bench itself is the check")


def test_profile_counts_each_operator_per_call():
    """align_by_expert sorts once and searches the block starts once per call: the table divides
    by the number of calls, and lists the busiest first."""
    gen = torch.Generator().manual_seed(0)
    x, logits = torch.randn(5, 64, generator=gen), torch.randn(5, 8, generator=gen)
    w13, w2 = torch.randn(8, 64, 64, generator=gen), torch.randn(8, 64, 32, generator=gen)
    weights, ids = torch.softmax(logits, -1).topk(2)
    with fused_moe_kernels(interpret=True) as kernels:
        bench = load_script("moe_bench")
        rows = bench.kernel_table(lambda: kernels.fused_moe(x, w13, w2, weights, ids), iters=3,
                                  device=torch.device("cpu"))
    launches = {name: n for name, n, _ in rows}
    assert launches["aten::searchsorted"] == 1 and launches["aten::argsort"] == 1
    times = [us for _, _, us in rows]
    assert times == sorted(times, reverse=True) and times[0] > 0
    lines = bench.format_kernel_table(rows)
    assert lines[0].strip().startswith(f"{sum(launches.values()):.0f} kernels, ")
    assert len(lines) == 1 + len(rows) and any("aten::searchsorted" in line for line in lines)
