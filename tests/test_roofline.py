"""benchmark/roofline.py: the recorder on tiny-qwen3 (every computed token in exactly one step)
and the report (table, JSON, replay from JSON, plot). The cost model it reports with,
minisgl.benchmark.roofline, is test_benchmark.py's (chapter 21)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest
import torch

from minisgl.benchmark.roofline import Hardware, ModelShape, StepShape, decode_bucket, step_cost
from minisgl.core import SamplingParams
from minisgl.models import ModelConfig
from benchmark_scripts import load_script

CHAPTER = None  # repository tooling, not a chapter: runs only in `make test`

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "models" / "tiny-qwen3"


roofline = load_script("roofline")


def test_aggregate_puts_prefill_first_then_decode_by_bucket():
    shape = ModelShape.of(ModelConfig.from_dir(TINY))
    hw = Hardware(bandwidth=1e9, peak_flops=1e12)
    steps = [StepShape.of("decode", [(5, 6)] * 9), StepShape.of("prefill", [(0, 5)] * 9),
             StepShape.of("decode", [(5, 6)]), StepShape.of("decode", [(6, 7)])]
    rows = roofline.aggregate(steps, [1.0, 2.0, 3.0, 4.0], shape, 2, hw)
    assert [(r.phase, r.batch_sizes, r.steps, r.tokens, r.measured_s) for r in rows] == [
        ("prefill", "", 1, 45, 2.0), ("decode", "1", 2, 2, 7.0), ("decode", "9–32", 1, 9, 1.0)]
    costs = [step_cost(shape, s, 2) for s in steps[2:]]
    assert rows[1].bound_s == sum(c.bound(hw) for c in costs)
    assert rows[1].memory_bound_steps == 2 and rows[1].ratio == 7.0 / rows[1].bound_s
    with pytest.raises(ValueError):  # a time for every step, no more, no less
        roofline.aggregate(steps, [1.0], shape, 2, hw)
    # The rows' keys, which the idle table groups by too: prefill sorts first.
    assert sorted(map(roofline.phase_key, steps)) == [
        (-1, ""), decode_bucket(1), decode_bucket(1), decode_bucket(9)]


# ----------------------------------------------------------------------------------------------
# Recorder


def test_recorder_sees_every_computed_token_once():
    llm = roofline.LLM(str(TINY), dtype=torch.float32, device="cpu", max_running_req=4,
                       num_page_override=1024, max_seq_len_override=256, page_size=1)
    # Different first tokens: no request can reuse another's prefix from the radix cache.
    prompts = [[100 + i] + list(range(200, 200 + n)) for i, n in enumerate((12, 30, 7, 20))]
    outputs = (3, 7, 1, 5)
    try:
        engine = llm.backend.scheduler.engine
        recording = roofline.record(llm, prompts, [SamplingParams(max_tokens=n, ignore_eos=True)
                                                   for n in outputs])
        assert "launch" not in vars(engine)  # the wrapper is gone
    finally:
        llm.shutdown()
    prefill, *decodes = recording.steps
    # One prefill computes every prompt token and samples each request's first output...
    assert prefill == roofline.StepShape.of("prefill", [(0, len(p)) for p in prompts])
    # ...then decode step j runs every request that still owes a token after j outputs: with
    # overlap, a request leaves the batch as soon as its last token is launched.
    assert all(s.phase == "decode" and s.new_tokens == s.requests for s in decodes)
    assert [s.requests for s in decodes] == [sum(n - 1 >= j for n in outputs)
                                             for j in range(1, max(outputs))] == [3, 3, 2, 2, 1, 1]
    assert sum(s.new_tokens for s in recording.steps) == (sum(map(len, prompts))
                                                          + sum(n - 1 for n in outputs))
    # Decode step j reads the prompt and the j - 1 outputs computed before it.
    assert sum(s.cached_tokens for s in decodes) == sum(
        len(p) + j - 1 for p, n in zip(prompts, outputs) for j in range(1, n))
    assert len(recording.seconds) == len(recording.steps)
    assert all(s > 0 for s in recording.seconds)
    assert sum(recording.seconds) <= recording.wall_seconds
    # Between the steps: the first has nothing before it; on the CPU each later gap is the
    # host's time from one launch's end to the next's start (processing, scheduling), and the
    # steps and the gaps together fit in generate()'s wall time.
    idle = recording.idle_before
    assert idle is not None and len(idle) == len(recording.steps) and idle[0] == 0
    assert all(i > 0 for i in idle[1:])
    assert sum(recording.seconds) + sum(idle) <= recording.wall_seconds


# ----------------------------------------------------------------------------------------------
# Report


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("roofline") / "run.json"
    out = io.StringIO()  # capsys is per test; this run serves the module
    with contextlib.redirect_stdout(out):
        assert roofline.main(["--model", str(TINY), "--device", "cpu", "--num-requests", "3",
                              "--json", str(path)]) == 0
    return path, out.getvalue()


def test_table_and_json(saved_run):
    path, printed = saved_run
    assert "3 个请求" in printed and "实测/下界" in printed
    assert "prefill" in printed and "decode，批 1" in printed
    assert "步前空闲合计" in printed and "超过 0.1 ms 的步" in printed
    data = json.loads(path.read_text())
    assert {"workload", "model", "device", "dtype", "prompt_tokens", "output_tokens", "shape",
            "dtype_bytes", "hardware", "parameters", "weight_bytes_per_step",
            "kv_bytes_per_token", "wall_s", "steps_measured_s", "phases", "steps"} <= set(data)
    assert data["workload"] == "small" and data["dtype"] == "float32"
    hw = data["hardware"]
    for step in data["steps"]:
        bytes_ = step["weight_bytes"] + step["kv_bytes"]
        assert step["bound_s"] == max(bytes_ / hw["bandwidth"], step["flops"] / hw["peak_flops"])
        assert step["bound_s"] > 0 and step["measured_s"] > 0 and step["idle_before_s"] >= 0
    phases = data["phases"]
    assert phases[0]["phase"] == "prefill"
    assert sum(p["steps"] for p in phases) == len(data["steps"])
    assert sum(p["tokens"] for p in phases) == sum(s["new_tokens"] for s in data["steps"])
    assert sum(p["measured_s"] for p in phases) == pytest.approx(data["steps_measured_s"])
    # Each request's decode steps: all its outputs but the one its prefill sampled.
    decode_tokens = sum(s["new_tokens"] for s in data["steps"] if s["phase"] == "decode")
    assert decode_tokens == sum(n - 1 for n in data["output_tokens"])


def test_replay_from_json_with_other_hardware(saved_run, tmp_path, capsys):
    path, _ = saved_run
    again = tmp_path / "again.json"
    first = json.loads(path.read_text())
    bandwidth, peak = first["hardware"]["bandwidth"] / 2, first["hardware"]["peak_flops"] / 2
    assert roofline.main(["--from-json", str(path), "--bandwidth", str(bandwidth),
                          "--peak-flops", str(peak), "--json", str(again)]) == 0
    assert "实测/下界" in capsys.readouterr().out
    second = json.loads(again.read_text())
    assert [s["measured_s"] for s in second["steps"]] == [s["measured_s"] for s in first["steps"]]
    assert [s["bound_s"] for s in second["steps"]] == pytest.approx(
        [2 * s["bound_s"] for s in first["steps"]])


def test_plot(saved_run, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "roofline.png"
    assert roofline.main(["--from-json", str(saved_run[0]), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_so_and_reports_the_rest(saved_run, tmp_path, capsys,
                                                             monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    png = tmp_path / "roofline.png"
    assert roofline.main(["--from-json", str(saved_run[0]), "--plot", str(png)]) == 1
    printed = capsys.readouterr()
    assert "matplotlib" in printed.err and len(printed.err.strip().splitlines()) == 1
    assert "实测/下界" in printed.out
    assert not png.exists()
