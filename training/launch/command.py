"""What a command tells the launcher about itself (:func:`training.launch.launcher.run`): its
name, whether its ranks train, whether it is a training run of its run directory, what it
makes of the resolved configuration first, and what it checks. Each command (:mod:`training.app`,
:mod:`training.evaluate`, :mod:`training.predict`, :mod:`training.parity`, :mod:`training.headroom`)
declares one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from training.config.schema import RunConfig


@dataclass(frozen=True)
class Command:
    """One command, as the launcher prepares its run.

    Args:
        name: ``train``, ``evaluate``, ``predict``, ``parity`` or ``headroom``.
        trains: its ranks train: ``model.attention_path=auto`` times backward passes too.
        continues_run: it is a training run of its run directory: it continues the run saved
            there (with the settings its command line does not give), refuses a checkpoint of
            another model, and writes ``config.yaml``.
        adopt: rewrites the resolved configuration before the store is read (a checkpoint's
            settings), or None.
        check: refuses, in one line, what the command cannot run, once the settings derived
            from the store are in (:mod:`training.launch.store_settings`), or None.
    """

    name: str
    trains: bool
    continues_run: bool = False
    adopt: Callable[[RunConfig], None] | None = None
    check: Callable[[RunConfig], None] | None = None


TRAIN = Command("train", trains=True, continues_run=True)
