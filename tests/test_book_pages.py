"""The book's chapter pages keep the book's shape: every section of the template, in its order,
and a length a reader finishes."""

from pathlib import Path

import pytest

CHAPTER = None  # repository tooling, not a chapter: runs only in `make test`

BOOK = Path(__file__).resolve().parents[1] / "book"
TEMPLATE = ["章首自测", "文件树与这一步的 main", "原理", "我们的实现", "官方实现对照", "测试与运行结果",
            "练习", "怎么讲清楚", "小结"]
MAX_CHARACTERS = 40_000  # what `wc -m` counts


def _pages() -> list[Path]:
    return sorted(BOOK.glob("ch[0-9][0-9]_*.md"))


def test_there_is_a_page_for_every_chapter() -> None:
    assert [page.name[:4] for page in _pages()] == [f"ch{n:02d}" for n in range(22)]


@pytest.mark.parametrize("page", _pages(), ids=lambda page: page.stem)
def test_a_page_has_every_section_of_the_template_in_order(page: Path) -> None:
    headings = [line[3:].strip() for line in page.read_text(encoding="utf-8").splitlines()
                if line.startswith("## ")]
    assert headings == TEMPLATE


@pytest.mark.parametrize("page", _pages(), ids=lambda page: page.stem)
def test_a_page_is_at_most_forty_thousand_characters(page: Path) -> None:
    assert len(page.read_text(encoding="utf-8")) <= MAX_CHARACTERS
