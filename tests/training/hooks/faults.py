"""Fault injection for the tests of what survives a lost rank: a step hook
(:mod:`training.hooks`), named in config (docs/reliability.md):

    debug.hooks=[tests.training.hooks.faults:FaultInjector] debug.hook_settings={fault_at_step:4}

Its settings (:class:`FaultSettings`, in ``debug.hook_settings``):

- ``fault_at_step = s``: rank ``fault_rank`` SIGKILLs itself in the middle of step ``s``
  (after its backward pass, before the optimiser step), the way a rank dies when its node
  fails. Once per run directory (marker file :data:`MARKER`). With ``fault_scope = node``
  it takes its whole node with it: the torchrun agent that started it and every rank that
  agent started (:func:`kill_node`).
- ``fault_every = n`` (the soak): a plan of faults about every ``n`` steps
  (:func:`fault_plan`, drawn from ``fault_seed``), each on a random rank at a random point: at a
  random time inside a step (a timer), after the backward pass, or in the middle of writing a
  checkpoint (rank 0 with half its bytes written; another rank while rank 0 writes). Each
  fault happens once per run directory (a marker in :data:`PLAN_DIR` names it), so a run
  restarted by ``torchrun --max-restarts`` goes on to the next.

A fault is a real ``SIGKILL`` of the process: nothing is cleaned up, as when a node fails.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from training.config.settings import at_least, one_of, or_null, setting
from training.hooks import HookContext, StepHook

HOOK = "tests.training.hooks.faults:FaultInjector"  # its name in debug.hooks
MARKER = "fault_injected"
PLAN_DIR = "faults"
POINTS = ("in_step", "after_backward", "checkpoint_write")


def fault_overrides(**settings: object) -> list[str]:
    """The command-line overrides that turn the injector on with ``settings``
    (``fault_overrides(fault_at_step=4)``)."""
    given = ",".join(f"{key}:{value}" for key, value in settings.items())
    return [f"debug.hooks=[{HOOK}]", f"debug.hook_settings={{{given}}}"]


@dataclass
class FaultSettings:
    fault_at_step: int | None = setting(None, or_null(at_least(0)))  # fault_rank SIGKILLs itself in this step, once
    fault_rank: int = setting(1, at_least(0))
    fault_scope: str = setting("rank", one_of("rank", "node"))  # node: the rank's torchrun agent and all its ranks
    fault_every: int | None = setting(None, or_null(at_least(2)))  # a rank SIGKILLed about every this many steps
    fault_seed: int = 0


@dataclass(frozen=True)
class Fault:
    index: int
    step: int  # the step it strikes in; for a checkpoint write, the checkpoint's step
    rank: int
    point: str  # one of POINTS

    @property
    def name(self) -> str:
        return f"{self.index:03d}-step{self.step}-rank{self.rank}-{self.point}"


def fault_plan(every: int, seed: int, steps: int, world: int, checkpoint_interval: int) -> list[Fault]:
    """Faults about every ``every`` steps (uniform in [every/2, 3 every/2]) before ``steps``;
    the same plan on every rank and every attempt."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    step = 0
    while True:
        step += rng.randint(max(1, every // 2), every + every // 2)
        point, rank = rng.choice(POINTS), rng.randrange(world)
        if point == "checkpoint_write":
            step = -(-step // checkpoint_interval) * checkpoint_interval
        if step >= steps:
            return faults
        faults.append(Fault(len(faults), step, rank, point))


class FaultInjector(StepHook):
    """This rank's share of the configured faults (see the module's docstring)."""

    Settings = FaultSettings

    def __init__(self, settings: FaultSettings, context: HookContext) -> None:
        super().__init__(settings, context)
        trainer, rank = context.cfg.trainer, context.rank
        self.run_dir, self.rank = context.run_dir, rank
        self.faults: list[Fault] = []
        if settings.fault_every:
            plan = fault_plan(
                settings.fault_every, settings.fault_seed, trainer.steps, context.world, trainer.checkpoint_interval
            )
            self.faults = [f for f in plan if f.rank == rank]
        self.single = settings.fault_at_step if settings.fault_rank == rank else None
        self.scope = settings.fault_scope
        self._timer: threading.Timer | None = None
        self._random = random.Random(f"{settings.fault_seed}-{rank}")

    def _due(self, step: int, point: str) -> Fault | None:
        for fault in self.faults:
            if fault.step == step and fault.point == point and not self._marker(fault).exists():
                return fault
        return None

    def _marker(self, fault: Fault) -> Path:
        return self.run_dir / PLAN_DIR / fault.name

    def start_step(self, step: int, typical_step_s: float) -> None:
        """Arm a timer for a fault at a random time inside this step (of about ``typical_step_s``)."""
        fault = self._due(step, "in_step")
        if fault is not None:
            delay = self._random.uniform(0.0, max(typical_step_s, 1e-3))
            self._timer = threading.Timer(delay, _die, [self._marker(fault), f"{fault.name}, {delay:.3f} s in"])
            self._timer.daemon = True
            self._timer.start()

    def after_backward(self, step: int) -> None:
        if self.single == step and not (self.run_dir / MARKER).exists():
            if self.scope == "node" and "TORCHELASTIC_RUN_ID" in os.environ:
                kill_node(self.run_dir / MARKER, f"rank {self.rank} killed its node at step {step}")
            _die(self.run_dir / MARKER, f"rank {self.rank} killed itself at step {step}")
        fault = self._due(step, "after_backward")
        if fault is not None:
            _die(self._marker(fault), fault.name)

    def checkpoint_write(self, step: int) -> Callable[[int], None] | None:
        """For the checkpoint of ``step``, a callable that kills this rank: rank 0 (the writer)
        with about half the file written, another rank when called (while rank 0 writes). None
        when no fault is due."""
        fault = self._due(step, "checkpoint_write")
        if fault is None:
            return None
        previous = self.run_dir / "checkpoints" / "latest.pt"
        half = previous.stat().st_size // 2 if self.rank == 0 and previous.exists() else 0

        def progress(written: int) -> None:
            if written >= half:
                _die(self._marker(fault), f"{fault.name}, {written} bytes written")

        return progress

    def close(self) -> None:
        """No fault after the run: cancel a timer that has not fired."""
        if self._timer is not None:
            self._timer.cancel()


def _write_marker(marker: Path, what: str) -> None:
    """Record a fault, durably, so that it happens once."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    with open(marker, "w") as f:
        f.write(what + "\n")
        f.flush()
        os.fsync(f.fileno())


def _die(marker: Path, what: str) -> None:
    """Record the fault, then SIGKILL this process."""
    _write_marker(marker, what)
    os.kill(os.getpid(), signal.SIGKILL)


def kill_node(marker: Path, what: str) -> None:
    """Record the fault, then SIGKILL this rank's torchrun agent (its parent) and everything the
    agent started, this process last: the node is gone at once, as when it loses power."""
    agent = os.getppid()
    victims = [pid for pid in descendants(agent) if pid != os.getpid()]
    _write_marker(marker, what)
    for pid in [agent, *victims]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def descendants(root: int) -> list[int]:
    """The processes below ``root``, from ``/proc`` (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, i = [root], 0
    while i < len(found):
        found += children.get(found[i], [])
        i += 1
    return found[1:]
