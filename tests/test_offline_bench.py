"""benchmark/offline.py: --ablate's rows, and one tiny run on the CPU whose table, JSON and
plot agree (tiny-qwen3, four requests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib import image

from benchmark_scripts import load_script

CHAPTER = None  # repository tooling, not a chapter: runs only in `make test`

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "models" / "tiny-qwen3"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


offline = load_script("offline")


def assert_png(path: Path) -> None:
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    height, width, _ = image.imread(path).shape
    assert height > 100 and width > 100


def test_ablations_name_what_they_change_and_mark_the_default_page_size():
    name, key, options = offline.ablation("overlap+cuda-graph", default_page=256)
    assert name == "我们：关掉重叠调度、CUDA Graph"
    assert key == "ours: no overlap, no CUDA graph"
    assert options == {"overlap": False, "cuda_graph": "off"}
    name, key, options = offline.ablation("radix+page-16", default_page=1)
    assert name == "我们：关掉 radix cache，page_size 16"
    assert options == {"cache_type": "naive", "page_size": 16}
    assert offline.ablation("page-256", default_page=256)[:2] == (
        "我们：page_size 256（默认）", "ours: page 256 (default)")
    assert offline.ablation("custom-kernels", default_page=1)[2] == {"custom_kernels": "off"}


@pytest.mark.parametrize("ablate, message", [("overlap+turbo", "unknown feature 'turbo'"),
                                             ("page-1+page-16", "sets the page size twice")])
def test_a_bad_ablation_is_a_usage_error_before_anything_runs(ablate, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        offline.main(["--model", str(TINY), "--ablate", ablate])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_tiny_run_prints_writes_and_draws_the_same_numbers(tmp_path, capsys):
    report_path, png = tmp_path / "offline.json", tmp_path / "offline.png"
    code = offline.main(["--model", str(TINY), "--num-requests", "4", "--rounds", "1",
                         "--ablate", "page-16", "custom-kernels", "radix",
                         "--json", str(report_path), "--plot", str(png)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads(report_path.read_text(encoding="utf-8"))
    rows = report["rows"]
    assert [row["name"] for row in rows] == [
        "我们：LLM.generate", "我们：page_size 16", "我们：关掉自定义 kernel",
        "我们：关掉 radix cache", "transformers 批量 generate"]
    assert [row["key"] for row in rows] == [
        "ours: LLM.generate", "ours: page 16", "ours: no custom kernels", "ours: naive cache",
        "transformers generate"]
    assert report["baseline"] == rows[-1]["name"]
    assert report["machine"].startswith("# 运行于")
    workload = report["workload"]
    assert (workload["name"], workload["requests"], workload["page_size"]) == ("cpu", 4, 1)
    vocab = offline.AutoConfig.from_pretrained(TINY).vocab_size
    assert workload["output_tokens"] == sum(offline.workload(4, 0, vocab)[1])
    baseline = rows[-1]["seconds"]
    for row in rows:
        assert row["seconds"] == min(row["rounds_s"]) > 0
        assert row["output_tokens_per_s"] == pytest.approx(workload["output_tokens"]
                                                            / row["seconds"])
        assert row["ratio"] == pytest.approx(baseline / row["seconds"])
    assert rows[-1]["ratio"] == 1.0
    table = offline.table(report)
    assert table in printed and "相对transformers 批量 generate" in table
    for row in rows:
        assert f"{row['output_tokens_per_s']:,.1f}" in table and f"{row['ratio']:.2f}x" in table
    assert_png(png)

    # Redrawn from the JSON alone: the same table, a new plot, nothing measured.
    redrawn = tmp_path / "redrawn.png"
    assert offline.main(["--from-json", str(report_path), "--plot", str(redrawn)]) == 0
    assert capsys.readouterr().out.splitlines()[:-1] == [workload["description"],
                                                         *table.splitlines()]
    assert_png(redrawn)


def test_the_plot_falls_back_to_english_names_without_a_cjk_font(tmp_path, capsys,
                                                                 monkeypatch):
    report = {"model": "m", "device_name": "CPU", "baseline": "transformers 批量 generate",
              "workload": {"name": "cpu", "requests": 2, "output_tokens": 10,
                           "dtype": "float32"},
              "rows": [{"name": "我们：LLM.generate", "key": "ours: LLM.generate",
                        "output_tokens_per_s": 20.0, "ratio": 2.0},
                       {"name": "transformers 批量 generate", "key": "transformers generate",
                        "output_tokens_per_s": 10.0, "ratio": 1.0}]}
    monkeypatch.setattr(offline, "CJK_FONTS", ())
    offline.plot(report, str(tmp_path / "english.png"))
    assert "没有找到中文字体" in capsys.readouterr().err
    assert_png(tmp_path / "english.png")
