"""benchmark/timeline.py: interval arithmetic and extraction on hand-made profiler events, and
one small run on the CPU (tiny-qwen3, float32) through the JSON and the figure."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

from benchmark_scripts import load_script

CHAPTER = None  # repository tooling, not a chapter: runs only in `make test`

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "models" / "tiny-qwen3"


timeline = load_script("timeline")


def _has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def event(name, start_us, end_us, device=DeviceType.CPU, thread=1, annotation=None):
    """What extract() reads of a torch.profiler FunctionEvent."""
    return SimpleNamespace(name=name, device_type=device, thread=thread,
                           time_range=SimpleNamespace(start=start_us, end=end_us),
                           is_user_annotation=(device == DeviceType.CPU if annotation is None
                                               else annotation))


def kernel(start_us, end_us):
    return event("gemm_kernel", start_us, end_us, DeviceType.CUDA, thread=7, annotation=False)


# ----------------------------------------------------------------------------------------------
# Intervals


def test_merge_joins_overlapping_and_touching_intervals():
    assert timeline.merge([(5, 6), (1, 3), (2, 4), (4, 4.5), (8, 9)]) == [(1, 4.5), (5, 6), (8, 9)]
    assert timeline.merge([(1, 10), (2, 3)]) == [(1, 10)]  # one inside another
    assert timeline.merge([]) == []


def test_clip_keeps_only_the_part_inside_the_window():
    assert timeline.clip([(-2, 1), (3, 4), (9, 12), (12, 13)], (0, 10)) == [(0, 1), (3, 4), (9, 10)]


def test_busy_fraction_counts_overlaps_once_and_ignores_time_outside_the_window():
    # Busy 1-4 (two kernels overlapping on 2-3), 6-7, and 9-10 of a kernel running to 12.
    busy = [(1, 3), (2, 4), (6, 7), (9, 12), (-5, -1)]
    assert timeline.busy_fraction(busy, (0, 10)) == pytest.approx(0.5)
    assert 1 - timeline.busy_fraction([(0, 2.5)], (0, 10)) == pytest.approx(0.75)  # idle


# ----------------------------------------------------------------------------------------------
# Extraction from profiler events


def synthetic_events():
    """A lead-in step (0-1000 us) and two measured steps (1000-3000, 3000-5000 us)."""
    events = [event("step", 0, 1000), event("step", 1000, 3000), event("step", 3000, 5000),
              event("schedule", 100, 200), event("launch", 200, 900),  # lead-in: dropped
              event("schedule", 1000, 1200), event("launch", 1200, 2000),
              event("process", 2000, 2900), event("wait", 2100, 2600),
              event("schedule", 3000, 3100), event("launch", 3100, 3900),
              event("process", 3900, 5000), event("wait", 4000, 4800),
              event("launch", 1000, 5000, thread=2),  # another thread: not the scheduler's
              event("aten::mm", 1300, 1400, annotation=False)]
    # The lead-in's batch runs 800-1600 us: only its part from 1000 us counts.
    events += [kernel(800, 1600), kernel(1500, 1700), kernel(1700, 1800),
               kernel(2100, 2500), kernel(2400, 2600), kernel(4900, 5600)]
    # record_function ranges mirrored on the GPU timeline are no device work
    events.append(event("launch", 1000, 5000, DeviceType.CUDA, thread=7, annotation=True))
    return events


def test_extract_measures_from_the_first_step_after_the_lead_in():
    trace = timeline.extract(synthetic_events(), "cuda")
    assert trace["window"] == [0.0, 4.0]
    assert trace["steps"] == [[0.0, 2.0], [2.0, 4.0]]
    assert trace["host"]["schedule"] == [[0.0, 0.2], [2.0, 2.1]]
    assert trace["host"]["launch"] == [[0.2, 1.0], [2.1, 2.9]]
    assert trace["host"]["wait"] == [[1.1, 1.6], [3.0, 3.8]]
    # 800-1800 and 2100-2600 merged; the last kernel clipped at the window's end.
    assert trace["device"] == [[0.0, 0.8], [1.1, 1.6], [3.9, 4.0]]


def test_summary_per_step_from_a_hand_made_trace():
    s = timeline.summarize(timeline.extract(synthetic_events(), "cuda"))
    assert s["ms_per_step"] == pytest.approx(2.0)
    assert s["device_busy"] == pytest.approx(1.4 / 4.0)
    assert s["device_busy_ms_per_step"] == pytest.approx(0.7)
    assert s["schedule_ms_per_step"] == pytest.approx(0.15)
    assert s["launch_ms_per_step"] == pytest.approx(0.8)
    assert s["process_ms_per_step"] == pytest.approx(1.0)
    assert s["wait_ms_per_step"] == pytest.approx(0.65)
    assert s["host_work_ms_per_step"] == pytest.approx(0.15 + 0.8 + 1.0 - 0.65)


def test_on_the_cpu_the_device_lane_is_the_forward_ranges():
    events = synthetic_events() + [event("forward", 1300, 1900), event("forward", 3200, 3800)]
    trace = timeline.extract(events, "cpu")
    assert trace["device"] == [[0.3, 0.9], [2.2, 2.8]]


def test_extract_needs_a_lead_in_and_a_measured_step():
    with pytest.raises(ValueError, match="1 step ranges"):
        timeline.extract([event("step", 0, 10)], "cpu")


# ----------------------------------------------------------------------------------------------
# A real run on the CPU

STEPS = 3
BATCH = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("timeline")
    argv = ["--device", "cpu", "--model", str(TINY), "--workload", "random", "--batch",
            str(BATCH), "--prompt-len", "12", "--page-size", "4", "--warmup", "1", "--steps",
            str(STEPS), "--json", str(out / "t.json")]
    if _has_matplotlib():
        argv += ["--plot", str(out / "t.png")]
    assert timeline.main(argv) == 0
    return out, json.loads((out / "t.json").read_text())


def test_json_has_both_modes_with_the_requested_steps(run):
    _, data = run
    assert [(k, m["overlap"]) for k, m in data["modes"].items()] == [("on", True), ("off", False)]
    for mode in data["modes"].values():
        assert len(mode["steps"]) == STEPS
        assert mode["launched"] == [["decode", BATCH]] * STEPS  # a steady decode window
        for phase in timeline.HOST_PHASES:  # one of each phase per step
            assert len(mode["host"][phase]) == STEPS, phase
        assert mode["device_source"] == "cpu" and mode["device"]


def test_numbers_are_sane(run):
    _, data = run
    for mode in data["modes"].values():
        s, window = mode["summary"], mode["window"]
        assert s["ms_per_step"] == pytest.approx(window[1] / STEPS) and s["ms_per_step"] > 0
        assert mode["ms_per_step_unprofiled"] > 0
        assert 0 < s["device_busy"] <= 1
        host = s["schedule_ms_per_step"] + s["launch_ms_per_step"] + s["process_ms_per_step"]
        assert 0 < host <= s["ms_per_step"] + 1e-6
        assert 0 <= s["wait_ms_per_step"] <= s["process_ms_per_step"]
        # On the CPU the forward runs inside launch: the host is never idle waiting for it.
        assert s["device_busy_ms_per_step"] <= s["launch_ms_per_step"] + 1e-6
        for spans in [mode["device"], *mode["host"].values()]:
            assert all(0 <= a <= b <= window[1] for a, b in spans)


def test_summary_prints_in_chinese_and_redraws_from_json(run, capsys, tmp_path):
    out, _ = run
    argv = ["--from-json", str(out / "t.json")]
    if _has_matplotlib():
        argv += ["--plot", str(tmp_path / "redrawn.png")]
    assert timeline.main(argv) == 0
    printed = capsys.readouterr().out
    assert "重叠开" in printed and "重叠关" in printed and "tiny-qwen3" in printed
    if _has_matplotlib():
        assert (tmp_path / "redrawn.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_writes_a_png(run):
    out, _ = run
    if not _has_matplotlib():
        pytest.skip("matplotlib is not installed")
    assert (out / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_a_plot_is_refused_before_running_unless_json_keeps_the_run(
        run, monkeypatch, capsys):
    out, _ = run
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    with pytest.raises(SystemExit):  # nothing would keep the run's numbers
        timeline.main(["--device", "cpu", "--model", str(TINY), "--plot", str(out / "x.png")])
    with pytest.raises(SystemExit):
        timeline.main(["--from-json", str(out / "t.json"), "--plot", str(out / "x.png")])
    assert "matplotlib" in capsys.readouterr().err
    assert not (out / "x.png").exists()
