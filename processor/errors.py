"""The base class of the errors that are the user's to fix.

A :class:`UserError` is a setting out of range, data that does not fit, a launch that cannot
work: its message is one line that says what to change, and an app reports it as that line
(no traceback, it is not a bug). Every such error in processor and in the apps derives from
it, so that telling a user error from a bug is one ``isinstance`` check, in this process or,
for a spawned rank, on the record of what the rank raised
(:class:`processor.runtime.failures.RankFailure`).
"""

from __future__ import annotations


class UserError(ValueError):
    """An error the user fixes (configuration, data, launch); its message is one line."""
