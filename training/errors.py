"""How the apps end on an error: a configuration or data error (the user's to fix) is one line
and exit code 2, a failure of another rank or node one line and exit code 3 (running again may
work), anything else a bug with its traceback. ``HYDRA_FULL_ERROR=1`` (Hydra's own switch)
brings the traceback back for every kind."""

from __future__ import annotations

import os
import re
import sys

from processor.runtime.torchrun import TorchrunSetupError, torchrun_rank
from training.cli_check import discard_refused_run_dir
from training.run_lock import RunDirBusyError

EXIT_USER_ERROR = 2  # the exit code of a configuration or data error
EXIT_PEER_FAILURE = 3  # another rank or node was lost, stuck or failed: running again may well work
DEBUG_HINT = "set HYDRA_FULL_ERROR=1 for the traceback"
# What a user fixes in the command line, the configs or the data; the rest are bugs. By name
# too, as a spawned rank's exception reaches the parent as text (see user_error).
_USER_ERRORS = (
    "ConfigValueError",
    "DatasetError",
    "CheckpointError",
    "ConfigError",
    "FileExistsError",
    "RunDirBusyError",
    "CheckpointWriteError",
    "TorchrunSetupError",
)


def exit_on_user_error(exc: BaseException, run_dir: str | None = None) -> None:
    """For a configuration or data error (:func:`user_error`): print ``error: <message>`` and the
    hint, and exit with :data:`EXIT_USER_ERROR`; for a failure of another rank or node
    (:func:`peer_failure`) the same with :data:`EXIT_PEER_FAILURE`. Returns (the caller
    re-raises) for a bug, or when ``HYDRA_FULL_ERROR=1`` asks for the traceback. A run directory
    this refused run made (``run_dir`` holding only Hydra's record and an empty log) is removed."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return
    message, code = user_error(exc), EXIT_USER_ERROR
    if message is None:
        message, code = peer_failure(exc), EXIT_PEER_FAILURE
    if message is None:
        return
    where = f"rank {torchrun_rank()}: " if torchrun_rank() != 0 else ""
    if code == EXIT_USER_ERROR and run_dir is not None and torchrun_rank() == 0:
        discard_refused_run_dir(run_dir)
    print(f"error: {where}{message}", file=sys.stderr)
    print(f"({DEBUG_HINT})", file=sys.stderr)
    sys.exit(code)


# What a rank's line in run_local's report says when the rank is not to blame for the failure.
_NOT_TO_BLAME = re.compile(r"^  rank \d+: (finished|died without a result|did not report|(?:\w+\.)*PeerFailureError: )")


def peer_failure(exc: BaseException) -> str | None:
    """The message of a failure of another rank or node (lost, stuck, or stopped by an error of
    its own), else None. For :func:`~processor.runtime.run_local`'s report: its rank lines, when
    every rank either died or blamed another (no traceback: nothing here is a bug)."""
    from processor.runtime import PeerFailureError

    if isinstance(exc, PeerFailureError):
        return str(exc)
    if not isinstance(exc, RuntimeError) or not _REPORT.match(str(exc)):
        return None
    lines = [line for line in str(exc).splitlines() if line.startswith("  rank ")]
    if not all(_NOT_TO_BLAME.match(line) for line in lines):
        return None
    return str(exc).splitlines()[0] + "\n" + "\n".join(lines)


_REPORT = re.compile(r"\d+ of \d+ ranks failed:\n")
_RANK_LINE = re.compile(r"^  rank \d+: (?:\w+\.)*(\w+): (.*)$", re.MULTILINE)
_EXCEPTION_LINE = re.compile(r"^(?:\w+\.)*(\w+): (.*)$")


def user_error(exc: BaseException) -> str | None:
    """The message of a configuration or data error, else None (a bug).

    :func:`processor.runtime.run_local` reports what its spawned ranks raised as the text of a
    ``RuntimeError`` (a line per rank, ``<module>.<Type>: <message>``, then the first rank's
    traceback); the type and message are read back from it, so an error on a rank is reported
    as if the parent had raised it.
    """
    from processor import ConfigError
    from training.checkpoint import CheckpointError
    from training.config import ConfigValueError
    from training.data import DatasetError
    from training.resume import CheckpointWriteError

    kinds = (
        ConfigValueError,
        DatasetError,
        CheckpointError,
        ConfigError,
        FileExistsError,
        RunDirBusyError,
        TorchrunSetupError,
    )
    if isinstance(exc, (*kinds, CheckpointWriteError)):
        return str(exc)
    if not isinstance(exc, RuntimeError) or not _REPORT.match(str(exc)):
        return None
    report = str(exc)
    for name, message in _RANK_LINE.findall(report):
        if name in _USER_ERRORS:
            return message
    # A message of several lines: the rank lines hold its last; the traceback ends with the rest.
    headers = [m for line in report.splitlines() if (m := _EXCEPTION_LINE.match(line))]
    if headers and headers[-1][1] in _USER_ERRORS:
        return headers[-1][2]
    return None
