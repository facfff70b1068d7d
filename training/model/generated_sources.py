"""The source files torch_geometric writes for a ``MessagePassing`` class, removed at exit.

torch_geometric generates a ``propagate`` for each ``MessagePassing`` class the first time a
process builds one, writes it into a file in the temporary directory and imports it from there
(``torch_geometric.template.module_from_template``, ``delete=False``), and never removes it: one
file a process a class, thousands in /tmp after a day of runs and tests. The module is loaded by
the time the class's ``__init__`` returns, so its file is only for tracebacks; it is removed when
the process exits.
"""

from __future__ import annotations

import multiprocessing.util
import os
import sys
import tempfile

from torch_geometric.nn import MessagePassing

_SCHEDULED: set[str] = set()


def remove_generated_source_at_exit(cls: type[MessagePassing]) -> None:
    """Remove the file of ``cls``'s generated ``propagate`` when this process exits: by
    multiprocessing's finalizers, which run at the exit of a spawned rank too, where ``atexit``
    does not (a forked child clears the finalizers it inherits, so only the builder removes it)."""
    path = getattr(sys.modules.get(cls.propagate.__module__), "__file__", None)
    if path is None or path in _SCHEDULED or os.path.dirname(path) != tempfile.gettempdir():
        return
    _SCHEDULED.add(path)
    multiprocessing.util.Finalize(None, _remove_quietly, args=(path,), exitpriority=0)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:  # already gone
        pass
