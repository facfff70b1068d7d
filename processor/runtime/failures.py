"""What a failed rank sends home, and the one exception a launcher raises for failed ranks.

A spawned rank that raises puts a :class:`RankFailure` on the launcher's results queue: a small
picklable record of the exception (its type, the names of its classes, what kind of failure it
is, the message, the traceback) and of where it happened (rank, node). The launcher adds one
for each rank that died or went silent, and raises :class:`RanksFailedError` holding them all;
its text is the report people read (a line per rank, then the first traceback), and an app
decides how to end (user error, peer failure, bug) from :attr:`RanksFailedError.failures`,
never from that text.
"""

from __future__ import annotations

import signal
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from processor.errors import UserError
from processor.runtime.placement import this_node


class FailureKind(str, Enum):
    """What a rank's failure says about whose fault it is."""

    USER = "user"  # a UserError: the configuration, data or launch is wrong
    PEER = "peer"  # PeerFailureError: it stopped because another rank or node failed
    BUG = "bug"  # any other exception
    DIED = "died"  # the process ended without a result (killed, crashed)
    SILENT = "silent"  # it did not report in time after another rank failed, and was killed


# Kinds whose rank is not to blame: with only these, the job failed because a rank or node was lost.
NOT_TO_BLAME = frozenset({FailureKind.PEER, FailureKind.DIED, FailureKind.SILENT})


def _qualified(cls: type) -> str:
    """``module.QualName`` as a traceback names it (bare for builtins)."""
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def kind_of(exc: BaseException) -> FailureKind:
    """The kind of failure an exception raised on a rank is."""
    from processor.runtime.watchdog import PeerFailureError  # (it imports torch.distributed)

    if isinstance(exc, UserError):
        return FailureKind.USER
    if isinstance(exc, PeerFailureError):
        return FailureKind.PEER
    return FailureKind.BUG


@dataclass(frozen=True)
class RankFailure:
    """What went wrong on one rank, as plain values (picklable across processes).

    ``type_name`` is the exception's qualified type (``training.data.dataset.DatasetError``),
    ``classes`` those of its method resolution order (the type first), both empty for a rank
    that died or went silent; ``message`` is ``str(exc)`` (or how the rank died); ``traceback``
    the formatted traceback ("" when there is none).
    """

    rank: int
    kind: FailureKind
    message: str
    type_name: str = ""
    classes: tuple[str, ...] = ()
    traceback: str = ""
    node: str = ""

    @classmethod
    def from_exception(cls, rank: int, exc: BaseException) -> RankFailure:
        """The record of ``exc``, raised on ``rank`` of this node (call in its ``except`` block)."""
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        classes = tuple(_qualified(c) for c in type(exc).__mro__ if c not in (BaseException, object))
        return cls(rank, kind_of(exc), str(exc), _qualified(type(exc)), classes, text, this_node())

    @classmethod
    def died(cls, rank: int, exitcode: int) -> RankFailure:
        """A rank whose process ended with ``exitcode`` (negative: the signal) and no result."""
        how = f"killed by {signal.Signals(-exitcode).name}" if exitcode < 0 else f"exit code {exitcode}"
        return cls(rank, FailureKind.DIED, f"died without a result ({how})", node=this_node())

    @classmethod
    def silent(cls, rank: int, waited_s: float) -> RankFailure:
        """A rank that had not reported ``waited_s`` seconds after the first failure (then killed)."""
        message = f"did not report within {waited_s:g} s of the first failure (killed)"
        return cls(rank, FailureKind.SILENT, message, node=this_node())

    def is_a(self, name: str) -> bool:
        """Whether the exception was an instance of the class ``name`` (qualified or bare)."""
        return any(c == name or c.rsplit(".", 1)[-1] == name for c in self.classes)

    @property
    def summary(self) -> str:
        """One line: ``<type>: <last line of the message>``, or how the rank ended."""
        if not self.traceback.strip():
            return self.message
        return self.traceback.strip().splitlines()[-1]


class RanksFailedError(RuntimeError):
    """Ranks of a job failed; :attr:`failures` says how, one :class:`RankFailure` per failed rank
    in the order they were seen (ranks gone silent last). Its text: ``N of M ranks failed:`` (N
    counting the ranks that reported or died), a line per rank, then the first traceback a rank
    sent.

    Args:
        ranks: the ranks of the job, in order (``range(world)`` for a whole world).
        failures: the failed ranks' records, in the order seen.
    """

    def __init__(self, ranks: Sequence[int], failures: Iterable[RankFailure]) -> None:
        self.ranks = tuple(ranks)
        self.failures = tuple(failures)
        super().__init__(self.report())

    def __reduce__(self) -> tuple[type, tuple[tuple[int, ...], tuple[RankFailure, ...]]]:
        return type(self), (self.ranks, self.failures)

    def failure_of(self, rank: int) -> RankFailure | None:
        return next((f for f in self.failures if f.rank == rank), None)

    def in_rank_order(self) -> list[RankFailure]:
        return sorted(self.failures, key=lambda f: self.ranks.index(f.rank))

    def rank_lines(self) -> list[str]:
        """The header and a line per rank (``finished`` for one that did not fail)."""
        reported = [f for f in self.failures if f.kind is not FailureKind.SILENT]
        lines = [f"{len(reported)} of {len(self.ranks)} ranks failed:"]
        for r in self.ranks:
            failure = self.failure_of(r)
            lines.append(f"  rank {r}: {'finished' if failure is None else failure.summary}")
        return lines

    def report(self) -> str:
        """:meth:`rank_lines`, then the first traceback a rank sent."""
        lines = self.rank_lines()
        first = next((f for f in self.failures if f.traceback), None)
        if first is not None:
            lines.append(f"rank {first.rank}'s traceback:\n{first.traceback}")
        return "\n".join(lines)
