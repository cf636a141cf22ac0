"""The book's records and the repository's words: every record a page names exists, every record
is named by a page, a test, a tool or a benchmark, every GPU record a page cites is one that a part
of benchmark/gpu/run.sh writes, and no tracked file speaks of how the project was made (work
sessions, tracker items, lent machines) instead of the software."""

import re
import subprocess
from pathlib import Path

import pytest

CHAPTER = None  # repository tooling, not a chapter: runs only in `make test`

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "book" / "runs"
RECORD_NAME = re.compile(r"(?:book/)?runs/([A-Za-z0-9_.\-]+\.(?:txt|json))")
# Where a record may be named: the pages, and the code that reads, draws or writes it.
CITING = ["book/*.md", "tests/*.py", "tools/*.py", "benchmark/**/*.py", "benchmark/**/*.sh",
          "benchmark/**/*.md", "README.md"]

# Spelled in pieces so that this file does not match itself.
_WORK = "sess" + "ion"
PROCESS_WORDS = re.compile(
    rf"{_WORK} ?[0-9]|{_WORK}[0-9]|iss" r"ue ?#?[0-9]|\u501f\u5230|\u8bbe\u5907\u65f6\u95f4"
    r"|_s[0-9]{2}[._]", re.IGNORECASE)
RUN_NUMBER_IN_NAME = re.compile(rf"_s[0-9]{{2}}[._]|{_WORK}", re.IGNORECASE)

RUN_SH = ROOT / "benchmark" / "gpu" / "run.sh"
# A GPU record is named after the card that made it (run.sh's ${CARD}): the book's are .h200.
GPU_RECORD = re.compile(r"\b([A-Za-z0-9_\-]+\.(h200|h100)\.(?:txt|json|png))\b")


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (a tree built by tools/steps.py)")
    return [name for name in out.splitlines() if (ROOT / name).is_file()]


def _citing_texts(patterns: list[str] = CITING) -> dict[str, str]:
    files = {path for pattern in patterns for path in ROOT.glob(pattern)}
    return {str(path.relative_to(ROOT)): path.read_text(encoding="utf-8") for path in files}


def part_records(card: str) -> dict[str, str]:
    """Each record benchmark/gpu/run.sh writes on a card, with the part that writes it: every
    `start NAME` and every --json / --plot "$OUT/NAME" inside a part_X function, ${CARD} and the
    part's loop variables that a name uses filled in."""
    script = RUN_SH.read_text(encoding="utf-8").replace("\\\n", " ")
    made = {}
    for part, body in re.findall(r"^part_(\w+)\(\) \{(.*?)^\}", script, re.MULTILINE | re.DOTALL):
        loops = dict(re.findall(r"\bfor (\w+) in ([^;]+); do", body))
        names = re.findall(r"^\s*start (\S+)", body, re.MULTILINE)
        names += re.findall(r'--(?:json|plot) "\$OUT/([^"]+)"', body)
        for name in names:
            expanded = [name.replace("${CARD}", card)]
            for variable in set(re.findall(r"\$\{?(\w+)\}?", expanded[0])):
                expanded = [n.replace("${%s}" % variable, word).replace(f"${variable}", word)
                            for n in expanded for word in loops[variable].split()]
            made.update(dict.fromkeys(expanded, part))
    return made


def test_the_part_records_are_read_from_run_sh() -> None:
    made = part_records("h200")
    assert made["ch21_ablate.h200.png"] == "ablate"
    assert made["ch21_timeline_b256.h200.json"] == "timeline"
    assert made["ch17_gpu_attention_main.h200.txt"] == "mains"
    assert made["gpu_pytest.h200.txt"] == "tests"
    assert "gpu_pytest.h100.txt" in part_records("h100")
    assert not [name for name in made if "$" in name or "{" in name]


def test_every_gpu_record_a_page_cites_is_made_by_a_part() -> None:
    made = {card: part_records(card) for card in ("h200", "h100")}
    unmade = sorted({f"{page}: {name}" for page, text in _citing_texts(["book/*.md"]).items()
                     for name, card in GPU_RECORD.findall(text) if name not in made[card]})
    assert not unmade, ("GPU records no part of benchmark/gpu/run.sh writes (add the command to a "
                        "part, or drop the number):\n" + "\n".join(unmade))


def test_a_gpu_record_names_the_part_that_writes_it() -> None:
    # run.sh's header: the date and machine, the versions, then "# benchmark/gpu/run.sh PART".
    made = part_records("h200") | part_records("h100")
    wrong = []
    for path in sorted(RUNS.glob("*.txt")):
        header = path.read_text(encoding="utf-8").splitlines()[:3]
        named = [line.split()[-1] for line in header if line.startswith("# benchmark/gpu/run.sh ")]
        if named and named[0] != made.get(path.name):
            wrong.append(f"{path.name}: made by {made.get(path.name)}, header says {named[0]}")
    assert not wrong, "\n".join(wrong)


def test_every_record_a_page_or_script_names_exists() -> None:
    # Tests are left out: tools/steps.py's tests write records into a fixture repository.
    sources = [pattern for pattern in CITING if not pattern.startswith("tests/")]
    missing = sorted({f"{source}: {name}" for source, text in _citing_texts(sources).items()
                      for name in RECORD_NAME.findall(text)
                      if not (RUNS / name).is_file() and "*" not in name})
    assert not missing, "named but not in book/runs:\n" + "\n".join(missing)


def test_every_record_is_named_somewhere() -> None:
    texts = "\n".join(_citing_texts().values())
    orphans = sorted(path.name for path in RUNS.iterdir() if path.name not in texts)
    assert not orphans, "records nothing names (cite them or delete them):\n" + "\n".join(orphans)


def test_no_tracked_file_speaks_of_how_the_project_was_made() -> None:
    hits = []
    for name in _tracked():
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # a picture or a binary record
        hits += [f"{name}:{number}: {line.strip()[:120]}"
                 for number, line in enumerate(text.splitlines(), 1) if PROCESS_WORDS.search(line)]
    assert not hits, "\n".join(hits[:50])


def test_no_tracked_file_name_carries_a_run_number() -> None:
    named = [name for name in _tracked() if RUN_NUMBER_IN_NAME.search(Path(name).name)]
    assert not named, "\n".join(named)


def test_the_word_check_catches_what_it_is_for() -> None:
    for line in [f"see {_WORK}25.sh", f"in {_WORK} 12 we", "ch21_offline_s" "25.h200.txt",
                 "fixes iss" "ue #51", "\u501f\u5230\u4e00\u5757 H200"]:
        assert PROCESS_WORDS.search(line), line
    for line in ["scope='" + _WORK + "'", "a process " + _WORK + " leader", "reuses_s0 = 1"]:
        assert not PROCESS_WORDS.search(line), line
