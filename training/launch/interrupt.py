"""Stopping a run by signal, as a user or a scheduler does: the first Ctrl-C (SIGINT) or SIGTERM
finishes the step in flight, writes a checkpoint and ends every rank; a second Ctrl-C ends the
run at once.

- In a rank, :class:`StopRequest` notes the first signal (or the launcher's stop marker); the
  training loop adds it to the sum it makes over the ranks after every step, so every rank
  stops after the same step.
- The launcher of local ranks (:class:`LauncherSignals`) starts them with SIGINT and SIGTERM
  ignored (a terminal's Ctrl-C reaches every process of its group: only the launcher acts on
  it; and a rank still starting must not die of it). On its first SIGINT or SIGTERM it writes
  the stop marker (``<run_dir>/.stop-request``, which a rank still starting sees at its first
  step) and passes SIGTERM on to every rank; on a second signal it kills them and exits. Under
  torchrun the agent passes a signal on as SIGTERM to the ranks itself.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code(signum: int) -> int:
    """The shell's exit status of a process ended by ``signum`` (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


STOP_MARKER = ".stop-request"  # in the run directory, while the launcher stops its ranks


class StopRequest:
    """The first stop signal this rank received (None: none yet), or the launcher's marker."""

    def __init__(self, marker: Path | None = None) -> None:
        self.signum: int | None = None
        self.marker = marker

    @property
    def requested(self) -> bool:
        if self.signum is None and self.marker is not None and self.marker.exists():
            self.signum = signal.SIGTERM  # the launcher's, passed on
        return self.signum is not None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        elif signum == signal.SIGINT:  # a second Ctrl-C: at once, no traceback
            print("error: interrupted again: stopping at once (the last checkpoint is kept)", file=sys.stderr)
            os._exit(exit_code(signum))


@contextlib.contextmanager
def stop_requests(run_dir: str | Path) -> Iterator[StopRequest]:
    """A :class:`StopRequest` fed by SIGTERM, the launcher's marker in ``run_dir`` and (unless a
    launcher ignores it for this rank) SIGINT while the block runs; the previous handlers come
    back after. Main thread only: elsewhere (a test's thread) only the marker can set it."""
    request = StopRequest(Path(run_dir) / STOP_MARKER)
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    handled = [signal.SIGTERM] + [signal.SIGINT] * (signal.getsignal(signal.SIGINT) is not signal.SIG_IGN)
    previous = {s: signal.signal(s, request._handle) for s in handled}
    try:
        yield request
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def remove_stop_marker(run_dir: str | Path) -> None:
    """Remove a stop marker left by a launcher that was killed (before the ranks start)."""
    (Path(run_dir) / STOP_MARKER).unlink(missing_ok=True)


class LauncherSignals:
    """The launcher's side (see the module docstring): enter before spawning the ranks, call
    :meth:`watch` with their processes once started. ``signum`` is the first signal received."""

    def __init__(self, run_dir: str | Path) -> None:
        self.signum: int | None = None
        self.marker = Path(run_dir) / STOP_MARKER
        self._procs: list[multiprocessing.Process] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> LauncherSignals:
        self._previous = {s: signal.getsignal(s) for s in SIGNALS}
        for s in SIGNALS:  # the ranks spawned now inherit it, until they handle them
            signal.signal(s, signal.SIG_IGN)
        return self

    def watch(self, procs: list[multiprocessing.Process]) -> None:
        """The ranks are started: act on signals from now on."""
        self._procs = procs
        for s in SIGNALS:
            signal.signal(s, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
            print(
                f"{signal_name(signum)}: finishing the step in flight (a training run then writes its "
                "checkpoint; Ctrl-C again to stop at once)",
                file=sys.stderr,
            )
            self.marker.touch()
            self._signal_ranks(signal.SIGTERM)
            return
        print("error: interrupted again: stopping every rank at once (the last checkpoint is kept)", file=sys.stderr)
        self._signal_ranks(signal.SIGKILL)
        os._exit(exit_code(self.signum))

    def _signal_ranks(self, signum: int) -> None:
        for p in self._procs:
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signum)

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self.marker.unlink(missing_ok=True)
