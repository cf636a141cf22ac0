"""benchmark/gpu/run.sh, checked without a GPU: it parses, its parts are the ones its README
documents, every script a part runs exists, and a wrong part is refused with the usage line."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CHAPTER = None  # repository tooling, not a chapter: runs only in `make test`

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmark" / "gpu"
RUN = GPU / "run.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def declared_parts() -> list[str]:
    """The PARTS=(...) list run.sh checks its arguments against."""
    match = re.search(r"^PARTS=\(([^)]*)\)", RUN.read_text(), re.MULTILINE)
    assert match, "run.sh declares PARTS=(...)"
    return match[1].split()


def test_run_sh_parses():
    subprocess.run(["bash", "-n", str(RUN)], check=True)
    subprocess.run(["bash", "-n", str(GPU / "setup.sh")], check=True)
    subprocess.run(["bash", "-n", str(GPU / "wheels.sh")], check=True)


def test_every_part_is_implemented_and_documented():
    parts = declared_parts()
    script = RUN.read_text()
    implemented = re.findall(r"^part_(\w+)\(\)", script, re.MULTILINE)
    assert sorted(implemented) == sorted(parts)
    readme = (GPU / "README.md").read_text()
    documented = re.findall(r"^\| `(\w+)` \|", readme, re.MULTILINE)
    assert sorted(documented) == sorted(parts)


def test_every_record_a_part_writes_is_in_its_readme_row():
    rows = {m[1]: m[0] for m in re.finditer(r"^\| `(\w+)` \|.*$",
                                            (GPU / "README.md").read_text(), re.MULTILINE)}
    missing = []
    for part, body in re.findall(r"^part_(\w+)\(\) \{(.*?)^\}", RUN.read_text(),
                                 re.MULTILINE | re.DOTALL):
        for record in re.findall(r"\bstart (\S+)", body):
            stem = record.split(".")[0]
            if "${" not in stem and stem not in rows[part]:  # a name built in a loop: skipped
                missing.append(f"{part}: {record}")
    assert not missing


def test_the_faults_part_arms_a_fault_on_the_gpu_and_bounds_a_queue_below_its_burst():
    body = re.search(r"^part_faults\(\) \{(.*?)^\}", RUN.read_text(),
                     re.MULTILINE | re.DOTALL)[1].replace("\\\n", " ")
    assert re.search(r"benchmark/device_fault\.py --device cuda", body)
    burst = re.search(r"benchmark/overload\.py --device cuda .*--requests (\d+).*--bounds ([\d ]+)",
                      body)
    assert burst, body
    requests, bounds = int(burst[1]), [int(b) for b in burst[2].split()]
    assert max(bounds) >= requests > min(bounds)  # one run accepts all, one refuses some


def test_every_script_a_part_runs_exists():
    script = RUN.read_text()
    paths = set(re.findall(r"\b((?:benchmark|tools)/[\w/]+\.py)\b", script))
    paths |= set(re.findall(r"\b(tests/test_\w+\.py)\b", script))
    assert paths, "run.sh runs scripts"
    missing = sorted(p for p in paths if not (ROOT / p).is_file())
    assert not missing


def test_the_gpu_test_modules_are_all_run():
    script = RUN.read_text()
    modules = {p.name for p in (ROOT / "tests").glob("test_*.py")
               if p.stem.endswith("_cuda") or p.stem.endswith("_gpu")}
    assert modules == set(re.findall(r"tests/(test_\w+\.py)", script))


@pytest.mark.parametrize("args", [[], ["no-such-part"], ["offline", "no-such-part"]])
def test_a_wrong_part_is_refused_with_the_usage_line(args, tmp_path):
    done = subprocess.run(["bash", str(RUN), *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)}, cwd=ROOT)
    assert done.returncode != 0
    assert "usage: benchmark/gpu/run.sh PART" in done.stderr
    assert not any(tmp_path.iterdir())  # refused before any setup or record
