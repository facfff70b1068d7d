"""How the apps end on an error: a configuration or data error (the user's to fix) is one line
and exit code 2, a failure of another rank or node one line and exit code 3 (running again may
work), anything else a bug with its traceback. ``HYDRA_FULL_ERROR=1`` (Hydra's own switch)
brings the traceback back for every kind."""

from __future__ import annotations

import os
import sys
import time
from typing import NoReturn

from processor.errors import UserError
from processor.runtime import PeerFailureError, RanksFailedError
from processor.runtime.failures import NOT_TO_BLAME, FailureKind
from processor.runtime.torchrun import torchrun_rank
from training.config.schema import ConfigValueError
from training.launch.cli_check import check_overrides, discard_refused_run_dir

EXIT_USER_ERROR = 2  # the exit code of a configuration or data error
EXIT_PEER_FAILURE = 3  # another rank or node was lost, stuck or failed: running again may well work
DEBUG_HINT = "set HYDRA_FULL_ERROR=1 for the traceback"
# What a user fixes, besides every processor.errors.UserError: the forecast store refuses to
# overwrite an existing one with a plain FileExistsError.
_ALSO_USER_ERRORS = (FileExistsError,)
# Seconds a torchrun follower waits before exiting on an error that rank 0 reports (seen: rank 1
# exited first and torchrun's SIGTERM reached rank 0 before its line).
FOLLOWER_GRACE_S = 10.0


def exit_on_bad_command_line(argv: list[str]) -> None:
    """Exit in one line (:func:`exit_on_user_error`) on the first override of ``argv`` that is
    not a setting of the training schema, does not fit its type, or names no config-group option
    (:func:`~training.launch.cli_check.check_overrides`); a torchrun rank other than 0 leaves the
    line to rank 0. This module and its imports are light beside the model's: ``python -m
    training`` calls this before it loads the app, so a misspelt key costs seconds less."""
    try:
        check_overrides(argv)
    except ConfigValueError as exc:
        if torchrun_rank() != 0:
            follower_exit()
        exit_on_user_error(exc)
        raise


def follower_exit() -> NoReturn:
    """Exit a torchrun rank other than 0 on an error that rank 0 reports: after
    :data:`FOLLOWER_GRACE_S` (torchrun stops it sooner, once rank 0 has exited), so that rank 0's
    one line is out before torchrun stops every rank."""
    time.sleep(FOLLOWER_GRACE_S)
    sys.exit(EXIT_USER_ERROR)


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


def peer_failure(exc: BaseException) -> str | None:
    """The message of a failure of another rank or node (lost, stuck, or stopped by an error of
    its own), else None. For :func:`~processor.runtime.run_local`'s
    :class:`~processor.runtime.RanksFailedError`: its header and rank lines, when every rank
    either finished, died, went silent or blamed another (no rank raised an error of its own)."""
    if isinstance(exc, PeerFailureError):
        return str(exc)
    if not isinstance(exc, RanksFailedError) or not all(f.kind in NOT_TO_BLAME for f in exc.failures):
        return None
    return "\n".join(exc.rank_lines())


def user_error(exc: BaseException) -> str | None:
    """The message of a configuration or data error (a :class:`~processor.errors.UserError`, or
    one of :data:`_ALSO_USER_ERRORS`), else None (a bug).

    For :func:`processor.runtime.run_local`'s :class:`~processor.runtime.RanksFailedError`, the
    message of the first rank (in rank order) whose record is of a user error: an error on a
    rank is reported as if the parent had raised it.
    """
    if isinstance(exc, (UserError, *_ALSO_USER_ERRORS)):
        return str(exc)
    if not isinstance(exc, RanksFailedError):
        return None
    also = [cls.__name__ for cls in _ALSO_USER_ERRORS]
    for failure in exc.in_rank_order():
        if failure.kind is FailureKind.USER or any(failure.is_a(name) for name in also):
            return failure.message
    return None
