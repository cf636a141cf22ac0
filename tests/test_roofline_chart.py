"""benchmark/roofline_chart.py: the roofline picture of chapter 21, drawn from the recorded runs
under book/runs/ on the CPU (no GPU needed to redraw it)."""

from __future__ import annotations

import json

import pytest

from benchmark_scripts import load_script

CHAPTER = None  # repository tooling, not a chapter: runs only in `make test`

chart = load_script("roofline_chart")


def test_step_points_add_up_the_recorded_steps():
    run = json.loads(chart.DEFAULTS["steps"].read_text())
    named, faint = chart.step_points(run)
    assert [p.label for p in named] == ["prefill (9 steps)", "decode, batch 1 (10 steps)",
                                        "decode, batch 256 (96 steps)"]
    prefill = [s for s in run["steps"] if s["phase"] == "prefill"]
    flops = sum(s["flops"] for s in prefill)
    assert named[0].intensity == pytest.approx(
        flops / sum(s["weight_bytes"] + s["kv_bytes"] for s in prefill))
    # 384.5 TFLOP/s: the prefill rate chapter 21 gives (138.6 TFLOP in 360.4 ms,
    # book/runs/ch21_roofline_intensity.txt)
    assert named[0].flops_per_s == pytest.approx(384.5e12, rel=0.01)
    decodes = sum(s["phase"] == "decode" for s in run["steps"])
    assert len(faint) == decodes - 10 - 96
    # decode never reaches the ridge: every step lies under the bandwidth roof
    hw = run["hardware"]
    assert all(p.flops_per_s < p.intensity * hw["bandwidth"] for p in named[1:] + faint)


def test_moe_and_kernel_rows_are_read_from_the_tables():
    moe = chart.moe_points(chart.DEFAULTS["moe"].read_text())
    assert [p.label for p in moe] == [f"MoE layer, {n} tok" for n in (1, 64, 256, 4096)]
    assert moe[-1].flops_per_s == 240.79e12
    assert moe[-1].intensity == pytest.approx(240.79e12 / 967e9)
    rates = chart.kernel_rates(chart.DEFAULTS["kernels"].read_text())
    assert rates[("store_kv", 16384)] == (36.72, 3655.5)
    qk = chart.kernel_points(rates)
    assert [p.label for p in qk] == ["qk_norm_rope, 256 tok", "qk_norm_rope, 16384 tok"]
    assert qk[1].flops_per_s == pytest.approx(7 / 4 * 2014.3e9)


def test_chart_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "roofline.png"
    assert chart.main(["--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
