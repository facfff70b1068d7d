"""``python -m benchmarks.machine_probe`` measures this machine (about 10 s) and prints it as
JSON, the planner's :class:`~processor.plan.Machine` (``--save PATH`` keeps it for
``strategy.machine=PATH`` and ``python -m benchmarks.auto_report``). The probe itself is
:func:`processor.plan.probe.probe`."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from processor.plan.probe import probe


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="threads per rank")
    parser.add_argument("--save", type=Path, help="write the probe here as JSON")
    args = parser.parse_args(argv)
    machine = probe(args.threads)
    text = json.dumps(dataclasses.asdict(machine), indent=2)
    print(text)
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(text + "\n")


if __name__ == "__main__":
    main()
