"""Local ranks start from a fork server, yet as spawned ranks would: with the caller's
environment and signal dispositions of the moment, not the server's when it started."""

from __future__ import annotations

import os
import signal

from processor.runtime import run_local


def _what_a_rank_has() -> tuple[str | None, bool, bool]:
    ignored = [signal.getsignal(s) is signal.SIG_IGN for s in (signal.SIGINT, signal.SIGTERM)]
    return os.environ.get("GRIDSHARD_TEST_LAUNCH"), *ignored


def _set(handlers: dict) -> dict:
    return {s: signal.signal(s, handler) for s, handler in handlers.items()}


def test_ranks_take_the_callers_environment_and_ignored_signals_of_the_moment(monkeypatch):
    # Both dispositions set here: a caller started in the background of a shell without job
    # control inherits SIGINT ignored, and the first case would then see it ignored.
    handled = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    previous = _set(handled)
    try:
        monkeypatch.setenv("GRIDSHARD_TEST_LAUNCH", "first")
        assert run_local(_what_a_rank_has, 2) == [("first", False, False)] * 2
        monkeypatch.setenv("GRIDSHARD_TEST_LAUNCH", "second")  # set after the fork server started
        _set(dict.fromkeys(handled, signal.SIG_IGN))
        assert run_local(_what_a_rank_has, 2) == [("second", True, True)] * 2
    finally:
        _set(previous)
