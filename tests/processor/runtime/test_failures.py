"""A failed rank's error reaches the launcher as a structured record, not as text to parse."""

from __future__ import annotations

import pickle
import socket

import pytest

from processor import ConfigError
from processor.errors import UserError
from processor.runtime import FailureKind, PeerFailureError, RankFailure, RanksFailedError, run_local


class _PlotError(UserError):
    """A user error no app has heard of: recognised by its base class alone."""


def _raise(exc: BaseException) -> RankFailure:
    try:
        raise exc
    except BaseException as caught:
        return RankFailure.from_exception(3, caught)


def test_a_record_holds_the_type_its_classes_and_its_kind():
    user = _raise(ConfigError("num_heads", "3 is out of range"))
    assert (user.rank, user.kind, user.message) == (3, FailureKind.USER, "num_heads: 3 is out of range")
    assert user.type_name == "processor.config.ConfigError"
    assert user.classes[:3] == ("processor.config.ConfigError", "processor.errors.UserError", "ValueError")
    assert user.is_a("UserError") and user.is_a("ValueError") and not user.is_a("KeyError")
    assert user.summary == "processor.config.ConfigError: num_heads: 3 is out of range"
    assert user.node == socket.gethostname() and user.traceback.startswith("Traceback")
    assert _raise(PeerFailureError("rank 1 was lost")).kind is FailureKind.PEER
    assert _raise(KeyError("a bug")).kind is FailureKind.BUG
    assert RankFailure.died(2, -9).message == "died without a result (killed by SIGKILL)"


def test_the_report_reads_as_before_and_survives_pickling():
    bug, user = _raise(KeyError("a bug")), _raise(_PlotError("plot.size must be > 0"))
    failures = [RankFailure(1, bug.kind, bug.message, bug.type_name, bug.classes, bug.traceback), user]
    error = RanksFailedError(range(4), [*failures, RankFailure.silent(2, 45.0)])
    lines = str(error).splitlines()
    assert lines[:5] == [
        "2 of 4 ranks failed:",  # a silent rank did not report: not counted, as before
        "  rank 0: finished",
        "  rank 1: KeyError: 'a bug'",
        "  rank 2: did not report within 45 s of the first failure (killed)",
        f"  rank 3: {__name__}._PlotError: plot.size must be > 0",
    ]
    assert lines[5] == "rank 1's traceback:" and "KeyError: 'a bug'" in str(error).splitlines()[-1]
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, RanksFailedError) and copy.failures == error.failures and str(copy) == str(error)
    assert [f.rank for f in copy.in_rank_order()] == [1, 2, 3]


def _user_error_on_rank_1_bug_on_rank_0() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 0:
        raise KeyError("a bug")
    raise _PlotError("plot.size must be > 0")


def test_run_local_raises_the_records_of_its_ranks():
    with pytest.raises(RanksFailedError) as info:
        run_local(_user_error_on_rank_1_bug_on_rank_0, 2, timeout_s=30, threads_per_rank=1)
    by_rank = {f.rank: f for f in info.value.failures}
    assert sorted(by_rank) == [0, 1]
    assert by_rank[0].kind is FailureKind.BUG and "raise KeyError" in by_rank[0].traceback
    assert by_rank[1].kind is FailureKind.USER and by_rank[1].message == "plot.size must be > 0"
    assert by_rank[1].type_name == f"{__name__}._PlotError" and by_rank[1].node == socket.gethostname()
    assert "  rank 1: " + by_rank[1].summary in str(info.value)
