"""How the app ends for a failure on spawned ranks, decided from the ranks' records: a user
error is one line and exit code 2, a lost or failed peer one line and exit code 3, a bug its
traceback (the caller re-raises)."""

from __future__ import annotations

import pytest

from processor.errors import UserError
from processor.runtime import FailureKind, RankFailure, RanksFailedError, run_local
from tests.processor.distributed.test_watchdog import TIMEOUT_S, collectives_with_a_fault
from training.launch.errors import (
    DEBUG_HINT,
    EXIT_PEER_FAILURE,
    EXIT_USER_ERROR,
    exit_on_user_error,
    peer_failure,
    user_error,
)


class _NewUserError(UserError):
    """A user error the app never named: its base class is what counts."""


def _a_user_error_on_rank_1() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise _NewUserError("members = 0 is out of range: expected > 0")


@pytest.fixture(autouse=True)
def _no_debug_switch(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)


def test_a_user_error_on_a_spawned_rank_exits_2(capsys):
    with pytest.raises(RanksFailedError) as info:
        run_local(_a_user_error_on_rank_1, 2, timeout_s=30, threads_per_rank=1)
    assert user_error(info.value) == "members = 0 is out of range: expected > 0"
    with pytest.raises(SystemExit) as exited:
        exit_on_user_error(info.value)
    assert exited.value.code == EXIT_USER_ERROR
    assert capsys.readouterr().err.splitlines() == [
        "error: members = 0 is out of range: expected > 0",
        f"({DEBUG_HINT})",
    ]


def test_the_text_is_not_what_decides():
    """A bug whose message reads like a user error's report line is still a bug."""
    fake = RankFailure(0, FailureKind.BUG, "DatasetError: x", "KeyError", ("KeyError",), "Traceback ...\nKeyError: x\n")
    error = RanksFailedError([0, 1], [fake])
    assert user_error(error) is None and peer_failure(error) is None
    exit_on_user_error(error)  # returns: the caller re-raises it, traceback and all
    assert "rank 0's traceback:\nTraceback ...\nKeyError: x" in str(error)
    plain = RuntimeError("1 of 1 ranks failed:\n  rank 0: training.data.dataset.DatasetError: x")
    assert user_error(plain) is None and peer_failure(plain) is None


def test_a_file_exists_error_on_a_rank_is_the_users():
    exists = RankFailure(1, FailureKind.BUG, "out.zarr exists", "FileExistsError", ("FileExistsError", "OSError"))
    assert user_error(RanksFailedError(range(2), [exists])) == "out.zarr exists"


def test_a_lost_peer_exits_3(capsys):
    with pytest.raises(RanksFailedError) as info:
        run_local(collectives_with_a_fault, 2, "kill", 1, timeout_s=TIMEOUT_S, threads_per_rank=1)
    kinds = {f.rank: f.kind for f in info.value.failures}
    assert kinds == {0: FailureKind.PEER, 1: FailureKind.DIED}, str(info.value)
    assert user_error(info.value) is None
    with pytest.raises(SystemExit) as exited:
        exit_on_user_error(info.value)
    assert exited.value.code == EXIT_PEER_FAILURE
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: 2 of 2 ranks failed:" and err[-1] == f"({DEBUG_HINT})"
    lost = "  rank 0: processor.runtime.watchdog.PeerFailureError: rank 1 was lost"
    assert any(line.startswith(lost) for line in err), err


def test_ctrl_c_is_one_line_where_the_command_says_what_it_leaves(capsys):
    """python -m training.evaluate / predict / headroom: no traceback, exit 130."""
    from omegaconf import OmegaConf

    from training.launch.launcher import run_reporting_errors

    def interrupted(cfg):
        raise KeyboardInterrupt

    cfg = OmegaConf.create({"run_dir": "unused"})
    with pytest.raises(SystemExit) as exited:
        run_reporting_errors(interrupted, cfg, interrupted="no skill table written")
    assert exited.value.code == 130
    assert capsys.readouterr().err.splitlines() == ["error: interrupted: no skill table written"]
    with pytest.raises(KeyboardInterrupt):  # a command that handles it itself gets it
        run_reporting_errors(interrupted, cfg)
