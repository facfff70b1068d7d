"""One run per run directory: an exclusive ``flock`` on ``<run_dir>/.run.lock`` for the run's life.

The lock is held by the process that prepares the run (the launcher of the local ranks, or
torchrun's rank 0), so a second run pointed at the same directory is refused at once with a
message naming the holder. The kernel drops a ``flock`` when its holder dies, so a crashed or
killed run leaves nothing stuck: the next run (or torchrun's restart) takes the lock again.
The file itself stays; it records the last holder for the message.
"""

from __future__ import annotations

import fcntl
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType

from processor.errors import UserError

LOCK_NAME = ".run.lock"


class RunDirBusyError(UserError, RuntimeError):
    """Another live run holds this run directory."""


class RunDirLock:
    """Context manager: hold ``<run_dir>/.run.lock`` exclusively, or raise :class:`RunDirBusyError`."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> RunDirLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirBusyError(
                f"run_dir {self.path.parent} is in use by another run ({holder}): wait for it to end, "
                "or give this run its own run_dir=..."
            ) from None
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {started}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
