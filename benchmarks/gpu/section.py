"""The GPU check's dated report, ``docs/benchmarks/gpu_check_<device>_<date>.md``, one sub-block
per part, and its line in the index of ``docs/benchmarks.md``.

A report holds one section, from its begin marker (device and date: one report per device and
day) to the end marker; its header (title, versions) comes first, then one block per part, each
between its own markers::

    <!-- gpu_check:begin NVIDIA H100 80GB HBM3 2026-11-25 -->
    # GPU check (2026-11-25, NVIDIA H100 80GB HBM3)
    ...header...
    <!-- gpu_check:part kernel -->
    ### Attention kernel ...
    <!-- gpu_check:part-end kernel -->
    <!-- gpu_check:end -->

:func:`write_section` merges the parts a call ran into the section with the same begin line
(a part replaces only its own block; the header is the latest call's), or appends a new section
(a file given with ``--doc`` may hold several). :func:`add_to_index` lists a new report on the
benchmarks page.
"""

from __future__ import annotations

import re
from pathlib import Path

BEGIN = "<!-- gpu_check:begin {} -->"
END = "<!-- gpu_check:end -->"
PART_BEGIN = "<!-- gpu_check:part {} -->"
PART_END = "<!-- gpu_check:part-end {} -->"
_PART = re.compile(r"<!-- gpu_check:part (\S+) -->\n(.*?)\n?<!-- gpu_check:part-end \1 -->", re.DOTALL)
INDEX_HEADING = "## Reports"  # the benchmarks page's list of report files, one line each


def device_slug(name: str) -> str:
    """A device's name as a file name's part: ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "device"


def report_path(folder: Path, device: str, day: str) -> Path:
    """The report of ``device`` on ``day`` (ISO date) in ``folder``: ``gpu_check_<device>_<day>.md``."""
    return folder / f"gpu_check_{device_slug(device)}_{day}.md"


def add_to_index(page: Path, report: Path, line: str) -> bool:
    """Add ``line`` (a Markdown list item linking ``report``) at the end of the list under
    :data:`INDEX_HEADING` in ``page``, unless a line there already names ``report``'s file;
    whether it was added. A page without that heading gets it, at its end."""
    lines = page.read_text().splitlines() if page.exists() else []
    if INDEX_HEADING not in lines:
        lines += ["", INDEX_HEADING, ""] if lines else [INDEX_HEADING, ""]
    start = lines.index(INDEX_HEADING) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    if any(f"({report.name})" in x or f"/{report.name})" in x for x in lines[start:end]):
        return False
    items = [i for i in range(start, end) if lines[i].startswith("- ")]
    at = items[-1] + 1 if items else end
    lines.insert(at, line)
    page.write_text("\n".join(lines) + "\n")
    return True


def compose(begin: str, header: str, parts: dict[str, str], order: tuple[str, ...] = ()) -> str:
    """The section's text: ``begin``, ``header``, the parts (those in ``order`` first, in that
    order, then the others as given), the end marker."""
    names = [n for n in order if n in parts] + [n for n in parts if n not in order]
    blocks = [f"{PART_BEGIN.format(n)}\n{parts[n].strip()}\n{PART_END.format(n)}" for n in names]
    return "\n".join([begin, header.strip(), "", *blocks, END])


def parse(section: str) -> dict[str, str]:
    """The part blocks of a section's text: ``{name: body}``, in the order they appear."""
    return {m.group(1): m.group(2) for m in _PART.finditer(section)}


def write_section(doc: Path, begin: str, header: str, parts: dict[str, str], order: tuple[str, ...] = ()) -> str:
    """Merge ``parts`` into the section of ``doc`` whose first line is ``begin`` (its other parts
    kept, in place), or append a new section at the end; return the section's text."""
    old = doc.read_text() if doc.exists() else ""
    if begin in old:
        head, rest = old.split(begin, 1)
        body, sep, tail = rest.partition(END)
        if not sep:
            raise ValueError(f"{doc}: {begin!r} has no {END!r} after it")
        text = compose(begin, header, parse(body) | parts, order)
        doc.write_text(head + text + tail)
    else:
        text = compose(begin, header, parts, order)
        doc.write_text((old.rstrip("\n") + "\n\n" if old.strip() else "") + text + "\n")
    return text
