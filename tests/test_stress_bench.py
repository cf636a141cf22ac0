"""benchmark/soak.py, overload.py and device_fault.py: their judging on made-up results, and a
short run of each against a real server (tiny-qwen3 on the CPU). The soak's run is the CI
version of the book's 20-minute one."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from benchmark_scripts import load_script
from processes import ROOT

CHAPTER = None  # repository tooling (the benchmark scripts), not a chapter: runs in `make test`

MODEL = ROOT / "models" / "tiny-qwen3"


@pytest.fixture(scope="module")
def soak():
    return load_script("soak")


@pytest.fixture(scope="module")
def overload():
    return load_script("overload")


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODEL)


# ----------------------------------------------------------------------------------------------
# The soak's workload and verdict


def test_the_soak_knows_which_requests_must_be_rejected(soak, tokenizer):
    online = load_script("online")
    words = online.single_token_words(tokenizer)
    mix = soak.Mix(["".join(words[:128]), "".join(words[128:256])], max_seq_len=512,
                   output_len=64, leave_share=0.25, longest_tail=384)
    rng = random.Random(0)
    requests = [soak.draw_request(rng, words, mix, tokenizer) for _ in range(400)]
    for req in requests:  # the server's count, and its rule (fit_max_tokens)
        assert req.prompt_tokens == len(online.prompt_ids(tokenizer, online.Request(req.prompt, 0)))
        assert req.rejected == (req.prompt_tokens + req.max_tokens > 512)
        assert req.leave_after is None or req.stream
    rejected = sum(r.rejected for r in requests)
    streams = [r for r in requests if r.stream]
    assert 0.02 < rejected / len(requests) < 0.3
    assert 0.15 < sum(r.leave_after is not None for r in streams) / len(streams) < 0.35
    assert {r.chat for r in requests} == {True, False}


@pytest.mark.parametrize("usage, finish, problem", [
    ({"prompt_tokens": 10, "completion_tokens": 5}, "length", None),
    ({"prompt_tokens": 10, "completion_tokens": 2}, "stop", None),
    ({"prompt_tokens": 10, "completion_tokens": 4}, "length", "finish_reason length after 4"),
    ({"prompt_tokens": 11, "completion_tokens": 5}, "length", "prompt_tokens 11, expected 10"),
    (None, "length", "no usage"),
])
def test_an_answer_is_checked_against_its_request(soak, usage, finish, problem):
    req = soak.SoakRequest("x", 10, 5, True, None, False)
    found = soak.check_usage(req, usage, finish)
    assert found == problem if problem is None else problem in found


def samples(rss: list[float]) -> list[dict]:
    return [{"t": float(t), "rss_mib": {"scheduler-rank0": r}} for t, r in enumerate(rss)]


def test_rss_growth_compares_the_medians_of_the_window_ends(soak):
    # Warm-up (t < 10) grows; afterwards one spike does not count, a steady climb does.
    flat = [100 + t for t in range(10)] + [200.0] * 20 + [260.0] + [200.0] * 9
    assert soak.rss_growth(samples(flat), 10, "scheduler-rank0") == (200.0, 0.0)
    climbing = [100.0] * 10 + [200 + t for t in range(30)]
    start, growth = soak.rss_growth(samples(climbing), 10, "scheduler-rank0")
    assert (start, growth) == (201.0, 27.0)
    with pytest.raises(ValueError, match="too few"):
        soak.rss_growth(samples([100.0] * 12), 10, "scheduler-rank0")


def report(**changes) -> dict:
    base = {"options": {"tolerance_mib": 8.0, "tolerance_share": 0.02},
            "end": {"stats": {"running": 0, "waiting": 0, "locked_pages": 0, "free_pages": 10,
                              "cached_pages": 90, "num_pages": 100, "evicted_pages": 500},
                    "fds": {"tokenizer": 20}},
            "baseline_fds": {"tokenizer": 20}, "tally": {"error_count": 0},
            "rss": {"tokenizer": (1000.0, 19.0)}}
    for path, value in changes.items():
        *keys, last = path.split("__")
        target = base
        for key in keys:
            target = target[key]
        target[last] = value
    return base


@pytest.mark.parametrize("changes, failure", [
    ({}, None),
    ({"end__stats__free_pages": 9}, "KV 页没有全部回来"),
    ({"end__stats__locked_pages": 1}, "KV 页没有全部回来"),
    ({"tally__error_count": 2}, "2 个请求出错"),
    ({"end__stats__evicted_pages": 0}, "一页也没有逐出"),
    ({"end__fds": {"tokenizer": 21}}, "文件描述符"),
    ({"rss": {"tokenizer": (1000.0, 21.0)}}, "tokenizer 预热后 RSS 涨了 21.0 MiB"),  # 2%: 20
    ({"rss": {"tokenizer": (100.0, 9.0)}}, "容差 8.0 MiB"),  # 8 MiB at least
])
def test_the_soak_verdict_names_each_failed_check(soak, changes, failure):
    failures = soak.verdict(report(**changes))
    assert (failures == []) if failure is None else any(failure in f for f in failures), failures


def test_a_short_soak_passes_and_draws_its_curves(soak, tmp_path, capsys):
    """The CI version judges what a short run can: every KV page back, the radix cache evicting,
    idle fds equal to the baseline, no error but the asked-for rejections. Its memory check
    runs too, over the 10 s after the warm-up (under a hundred requests on 2 cores): at 8 MiB it
    catches only a gross leak, about 100 KB a request; flat memory is the recorded 20-minute
    run's to show (book/runs/ch21_soak_cpu.json)."""
    code = soak.main(["--model", str(MODEL), "--duration", "15", "--warm-up", "5",
                      "--interval", "0.5", "--json", str(tmp_path / "soak.json"),
                      "--plot", str(tmp_path / "soak.png")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "结论：全部通过" in out and "出错 0" in out
    assert (tmp_path / "soak.png").stat().st_size > 10_000
    assert soak.main(["--from-json", str(tmp_path / "soak.json"),
                      "--plot", str(tmp_path / "again.png")]) == 0


# ----------------------------------------------------------------------------------------------
# The overload burst and the device fault


def answer(overload, status: int, tokens: int = 16, error: dict | None = None):
    body = ({"usage": {"completion_tokens": tokens}} if status == 200 else
            {"error": error or {"type": "server_error", "message": "... (--max-queued-req 1)"}})
    return overload.Answer(status, 0.1, body)


@pytest.mark.parametrize("answers, bound, problem", [
    ([(200,), (503,)], 1, None),
    ([(200,), (500,)], 1, "既不是 200 也不是 503"),
    ([(200, 15), (503,)], 1, "输出不是 16 个 token"),
    ([(200,), (503, 16, {"type": "invalid_request_error", "message": "x"})], 1, "不是 OpenAI"),
    ([(200,), (503,)], 4096, "却有 1 个 503"),
])
def test_the_overload_judge_finds_what_is_wrong(overload, answers, bound, problem):
    counts, problems = overload.judge([answer(overload, *a) for a in answers], 16, bound)
    assert counts["sent"] == len(answers)
    assert (problems == []) if problem is None else any(problem in p for p in problems), problems


def test_a_small_burst_completes_what_it_accepts_and_refuses_the_rest(overload, capsys):
    code = overload.main(["--model", str(MODEL), "--requests", "60", "--bounds", "4096", "4",
                          "--num-pages", "256", "--server-threads", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "结论：全部通过" in out
    assert '"type": "server_error"' in out  # the bounded run refused some: their 503 shown


def test_the_device_fault_script_sees_the_server_end_cleanly(capsys):
    device_fault = load_script("device_fault")
    code = device_fault.main(["--model", str(MODEL), "--step", "30", "--streams", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "minisgl: scheduler-rank0 exited with code 1 (minisgl.scheduler.io.StepFailed: " \
        "step 30 failed (" in out
    assert "结论：干净地收场" in out
