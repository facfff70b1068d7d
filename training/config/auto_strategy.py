"""``strategy=auto``: the cost model picks the strategy and its knobs before any rank starts.

The launching process describes the run's processor (hidden grid, model, batch, precision,
``trainer.ranks_per_model``) to :func:`processor.plan.choose` with the machine of
``strategy.machine`` (``probe``: measured now, about 10 s; a preset such as
``h100_nvlink_ib``; or a saved probe's JSON). It prints every candidate's predicted step
time, bytes and memory, replaces ``strategy`` by the pick, and keeps the prediction under
``strategy.auto`` (logged to MLflow with the other parameters, as ``strategy.auto.*``).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from processor.plan import Workload, choose, load_machine
from processor.strategies import strategy_class
from training.config.schema import ConfigValueError, RunConfig

log = logging.getLogger(__name__)
MIB = 2**20


def resolve_auto(cfg: RunConfig, hidden_points: int) -> RunConfig:
    """``cfg`` itself unless ``strategy.name`` is ``auto``; else a copy with the pick in place,
    for a processor on ``hidden_points`` points."""
    if cfg.strategy.name != "auto":
        return cfg
    t, m = cfg.trainer, cfg.model
    work = Workload.of(hidden_points, m, t.batch_size, t.ranks_per_model, t.precision)
    try:
        considered = [strategy_class(name) for name in cfg.strategy.consider]  # before a probe: fail fast
        machine = load_machine(cfg.strategy.machine, t.threads_per_rank, m.num_channels, m.num_heads)
        pick, table = choose(work, machine, considered)
    except ValueError as exc:
        raise ConfigValueError(f"strategy=auto: {exc}") from None
    print(describe_choice(work.points, work.ranks, machine.name, pick, table))
    cfg = copy.deepcopy(cfg)
    cfg.strategy.name = pick.strategy.config_name
    for option, value in pick.strategy.options().items():
        setattr(cfg.strategy, option, value)  # a built-in strategy's option: a field of StrategyConfig
    cfg.strategy.auto = {
        "choice": pick.label,
        "machine": machine.name,
        "predicted_step_s": round(pick.step_s, 6),
        "predicted": {p.label: round(p.step_s, 6) for p in table},
    }
    return cfg


def describe_choice(points: int, ranks: int, machine: str, pick: Any, table: list[Any]) -> str:
    """The candidates' predictions as a table, the pick first."""
    lines = [
        f"strategy=auto on {machine}: {points} points over {ranks} ranks; picked {pick.label}",
        f"  {'strategy':<34} {'step (s)':>9} {'compute':>9} {'comm':>9} {'exposed':>9} {'MiB sent':>9} {'MiB/rank':>9}",
    ]
    for p in table:
        lines.append(
            f"  {p.label:<34} {p.step_s:9.4f} {p.compute_s:9.4f} {p.comm_s:9.4f} {p.exposed_comm_s:9.4f} "
            f"{p.bytes_sent / MIB:9.2f} {p.memory_b / MIB:9.0f}{'' if p.fits else '  (does not fit)'}"
        )
    return "\n".join(lines)
