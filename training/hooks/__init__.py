"""Step hooks: code from outside the stages that the training loop calls at fixed points, named
in config (``debug.hooks``, each ``'package.module:ClassName'``) with its settings in
``debug.hook_settings``. None by default: the loop then calls :class:`StepHook`'s no-ops.

The points, in the order a step meets them:

- :meth:`StepHook.start_step` before the step's forward pass;
- :meth:`StepHook.model_inputs` on the batch's inputs (this rank's block of them);
- :meth:`StepHook.after_backward` after backward, before clipping and the optimiser step;
- :meth:`StepHook.checkpoint_write` before a checkpoint is written: a callable it returns is
  given the bytes rank 0 has written after each write (0 on the other ranks while rank 0 writes);
- :meth:`StepHook.close` when the run ends, however it ends.

A hook class takes ``(settings, context)``: ``settings`` an instance of its ``Settings``
dataclass (ranges declared with :func:`training.config.settings.setting`), filled from the
``debug.hook_settings`` keys it has; ``context`` the run's :class:`HookContext`. A key of
``debug.hook_settings`` that no named hook has is refused, naming the key.

The test suite's fault injection and the parity check's perturbation are hooks of this kind
(``tests/training/hooks/``, docs/reliability.md).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor

from training.config.settings import ConfigValueError, check_ranges

if TYPE_CHECKING:
    from training.config.schema import RunConfig


@dataclass(frozen=True)
class HookContext:
    """Where a hook runs: the run's resolved configuration and this rank's place in the world."""

    cfg: RunConfig
    rank: int
    world: int

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run_dir)


@dataclass
class NoSettings:
    """The settings of a hook that takes none."""


class StepHook:
    """A hook that does nothing at every point; subclasses override the points they need."""

    Settings: ClassVar[type] = NoSettings

    def __init__(self, settings: Any = None, context: HookContext | None = None) -> None:
        self.settings, self.context = settings, context

    @classmethod
    def check(cls, settings: Any, cfg: RunConfig, world: int) -> None:
        """Raise :class:`ConfigValueError` where ``settings`` cannot work on ``world`` ranks
        (called before any rank starts)."""

    def start_step(self, step: int, typical_step_s: float) -> None:
        """Before step ``step``, whose duration is about ``typical_step_s`` (the last one's)."""

    def model_inputs(self, step: int, x: Tensor) -> Tensor:
        """The inputs ``(batch, local points, inputs)`` the model gets at ``step``: ``x`` itself here."""
        return x

    def after_backward(self, step: int) -> None:
        """After step ``step``'s backward pass, before clipping and the optimiser step."""

    def checkpoint_write(self, step: int) -> Callable[[int], None] | None:
        """For the checkpoint after ``step``, a callable given the bytes written so far, or None."""
        return None

    def close(self) -> None:
        """The run has ended (also by an error)."""


class StepHooks(StepHook):
    """Several hooks called in the order named; one of :class:`StepHook`'s kind itself."""

    def __init__(self, hooks: list[StepHook]) -> None:
        super().__init__()
        self.hooks = hooks

    def start_step(self, step: int, typical_step_s: float) -> None:
        for hook in self.hooks:
            hook.start_step(step, typical_step_s)

    def model_inputs(self, step: int, x: Tensor) -> Tensor:
        for hook in self.hooks:
            x = hook.model_inputs(step, x)
        return x

    def after_backward(self, step: int) -> None:
        for hook in self.hooks:
            hook.after_backward(step)

    def checkpoint_write(self, step: int) -> Callable[[int], None] | None:
        calls = [c for c in (hook.checkpoint_write(step) for hook in self.hooks) if c is not None]
        if not calls:
            return None

        def each(written: int) -> None:
            for call in calls:
                call(written)

        return each

    def close(self) -> None:
        for hook in self.hooks:
            hook.close()


def hook_class(name: str) -> type[StepHook]:
    """The :class:`StepHook` subclass named ``'package.module:ClassName'`` in ``debug.hooks``."""
    module_name, _, class_name = name.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigValueError(
            f"debug.hooks names {name!r}, which cannot be imported ({exc}): give 'package.module:ClassName' "
            "importable from where the run starts"
        ) from None
    if not (isinstance(found, type) and issubclass(found, StepHook)):
        raise ConfigValueError(f"debug.hooks names {name!r}, which is not a training.hooks.StepHook subclass")
    return found


def hook_settings(names: list[str], given: Any) -> list[tuple[type[StepHook], Any]]:
    """Each named hook's class with its settings from ``given`` (``debug.hook_settings``: a
    mapping, or None for none), ranges checked. Raises :class:`ConfigValueError` naming a key
    no named hook has."""
    if not isinstance(given, Mapping | None):
        raise ConfigValueError(f"debug.hook_settings = {given!r}: give a mapping, e.g. debug.hook_settings={{key:1}}")
    given = dict(given or {})
    classes = [hook_class(name) for name in names]
    known = {f.name for cls in classes for f in dataclasses.fields(cls.Settings)}
    for key in given:
        if key not in known:
            have = ", ".join(sorted(known)) or "none"
            raise ConfigValueError(
                f"debug.hook_settings.{key} is not a setting of the hooks in debug.hooks ({have}): "
                "name the hook that takes it in debug.hooks, or drop the key"
            )
    built = []
    for cls in classes:
        fields = {f.name for f in dataclasses.fields(cls.Settings)}
        try:
            settings = cls.Settings(**{k: v for k, v in given.items() if k in fields})
        except TypeError as exc:
            raise ConfigValueError(f"debug.hook_settings for {cls.__name__}: {exc}") from None
        check_ranges(settings, "debug.hook_settings.")
        built.append((cls, settings))
    return built


def check_hooks(cfg: RunConfig, world: int) -> None:
    """Raise :class:`ConfigValueError` where ``debug.hooks`` or ``debug.hook_settings`` cannot
    work on ``world`` ranks: a name that is not a hook, a key none has, a value out of range."""
    for cls, settings in hook_settings(cfg.debug.hooks, cfg.debug.hook_settings):
        cls.check(settings, cfg, world)


def load_hooks(cfg: RunConfig, rank: int, world: int) -> StepHook:
    """The hooks ``cfg.debug`` names, built for this rank (one :class:`StepHooks`), or a
    :class:`StepHook` that does nothing when it names none."""
    if not cfg.debug.hooks:
        return StepHook()
    context = HookContext(cfg, rank, world)
    built = hook_settings(cfg.debug.hooks, cfg.debug.hook_settings)
    return StepHooks([cls(settings, context) for cls, settings in built])
