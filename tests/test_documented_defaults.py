"""The defaults the docs state are the schema's. In docs/training.md and the README, every
"`key` (default V)" or "`key`, default V" (a key of a section table's row may be short: the row's
first cell names the section) and every row of a table with a ``key`` and a ``default`` column is
checked against the dataclass defaults of :class:`training.config.schema.RunConfig`."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

from training.config.schema import RunConfig

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "docs" / "training.md", ROOT / "README.md")
INLINE = re.compile(r"`(?P<key>[a-z_][a-z0-9_.]*)`(?: \(|, )default (?P<value>`[^`]+`|[^\s;,:)]+)")
NO_DEFAULT = "???"  # omegaconf.MISSING: a preset or the command line must set it


def schema_defaults(cls: type = RunConfig, prefix: str = "") -> dict[str, Any]:
    """Every leaf key of the schema (dotted) with its dataclass default; sections (fields whose
    ``default_factory`` makes a dataclass) are walked into."""
    found: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = NO_DEFAULT
        if dataclasses.is_dataclass(value):
            found.update(schema_defaults(type(value), f"{prefix}{f.name}."))
        else:
            found[f"{prefix}{f.name}"] = value
    return found


def documented_defaults(text: str, sections: set[str]) -> list[tuple[str, str]]:
    """``(key, stated default)`` for every default ``text`` states (fenced code left out)."""
    found: list[tuple[str, str]] = []
    header: list[str] | None = None
    prose: list[str] = []

    def end_paragraph() -> None:
        found.extend((m["key"], m["value"]) for m in INLINE.finditer(" ".join(prose)))
        prose.clear()

    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            if line.strip():
                prose.append(line.strip())
            else:
                end_paragraph()
            continue
        end_paragraph()
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if not line.strip("|-: "):
            continue  # the separator row
        row = dict(zip(header, cells))
        if "key" in row and "default" in row:
            found.append((row["key"].strip("`"), row["default"]))
        section = cells[0].strip("`")
        for m in INLINE.finditer(line):
            key = m["key"]
            if key.split(".")[0] not in sections and section in sections:
                key = f"{section}.{key}"
            found.append((key, m["value"]))
    end_paragraph()
    return found


def parse(value: str) -> Any:
    """A stated default as Python: ``true``/``false``, ``null``, a number, else the text."""
    value = value.strip().strip("`")
    if value in ("true", "false"):
        return value == "true"
    if value in ("null", "None"):
        return None
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def agrees(stated: Any, default: Any) -> bool:
    if isinstance(stated, bool) or isinstance(default, bool):
        return type(stated) is type(default) and stated == default
    if isinstance(stated, (int, float)) and isinstance(default, (int, float)):
        return math.isclose(stated, default, rel_tol=1e-12)
    return stated == default


def disagreements(stated: list[tuple[str, str]], defaults: dict[str, Any]) -> list[str]:
    """One line per stated default that is not the schema's (or names no key of it)."""
    wrong = []
    for key, raw in stated:
        if key not in defaults:
            wrong.append(f"{key}: not a key of the schema")
        elif defaults[key] == NO_DEFAULT:
            wrong.append(f"{key}: stated {raw}, but the schema has no default")
        elif not agrees(parse(raw), defaults[key]):
            wrong.append(f"{key}: stated {raw}, the schema's is {defaults[key]!r}")
    return wrong


DEFAULTS = schema_defaults()
SECTIONS = {key.split(".")[0] for key in DEFAULTS if "." in key}


def test_the_docs_state_the_main_defaults():
    keys = {key for page in PAGES for key, _ in documented_defaults(page.read_text(), SECTIONS)}
    assert len(keys) >= 10, sorted(keys)
    assert {"trainer.steps", "trainer.lr", "trainer.nprocs", "parity.steps"} <= keys


def test_every_default_the_docs_state_is_the_schemas():
    for page in PAGES:
        stated = documented_defaults(page.read_text(), SECTIONS)
        assert not disagreements(stated, DEFAULTS), page.name


def test_a_stale_or_unknown_default_fails():
    text = (
        "Trains for `trainer.steps` (default\n600) steps.\n\n"
        "| section | what |\n|---|---|\n| `parity` | `steps` (default 3), `reference` (default 2) |\n\n"
        "| key | default |\n|---|---|\n| `trainer.lr` | 0.01 |\n| `trainer.compile` | 0 |\n| `trainer.stepz` | 1 |\n"
        "```bash\npython -m training  # `trainer.seed` (default 7) in a code block is not a statement\n```\n"
    )
    stated = documented_defaults(text, SECTIONS)
    assert [key for key, _ in stated] == [
        "trainer.steps", "parity.steps", "parity.reference", "trainer.lr", "trainer.compile", "trainer.stepz"
    ]  # fmt: skip
    wrong = disagreements(stated, DEFAULTS)
    assert [line.split(":")[0] for line in wrong] == [
        "trainer.steps", "parity.reference", "trainer.lr", "trainer.compile", "trainer.stepz"
    ]  # fmt: skip
    assert "stated 600, the schema's is 1000" in wrong[0]
