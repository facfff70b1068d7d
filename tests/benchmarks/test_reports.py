"""The benchmarks page stays a page a reader finishes: ``docs/benchmarks.md`` is at most 200
lines; every dated report in ``docs/benchmarks/`` is named ``<theme>_<host>_<date>.md``, starts
with its title and is listed once in the page's index; and every report the page links exists."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.gpu.section import INDEX_HEADING

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGE = DOCS / "benchmarks.md"
REPORT_NAME = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*_[a-z0-9-]+_\d{4}-\d{2}-\d{2}\.md")


def _reports() -> list[Path]:
    return sorted((DOCS / "benchmarks").glob("*.md"))


def _index() -> list[str]:
    lines = PAGE.read_text().splitlines()
    start = lines.index(INDEX_HEADING) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    return [line for line in lines[start:end] if line.startswith("- ")]


def test_the_page_is_short():
    assert len(PAGE.read_text().splitlines()) <= 200


def test_every_report_is_named_titled_and_listed_once():
    reports = _reports()
    assert reports
    index = _index()
    for report in reports:
        assert REPORT_NAME.fullmatch(report.name), report.name
        first = report.read_text().splitlines()[0]
        assert first.startswith("# ") or first.startswith("<!-- gpu_check:begin"), report.name
        listed = [line for line in index if f"(benchmarks/{report.name})" in line]
        assert len(listed) == 1, (report.name, listed)
    assert len(index) == len(reports)


def test_every_report_the_page_links_exists():
    targets = re.findall(r"\]\((benchmarks/[^)#\s]+\.md)", PAGE.read_text())
    assert targets
    missing = sorted({t for t in targets if not (DOCS / t).exists()})
    assert not missing, missing
