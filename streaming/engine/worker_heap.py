"""Python workers' garbage collections, kept to the objects a task made.

PySpark's daemon runs a full ``gc.collect()`` in a reused Python worker after every task, and a
full collection walks every object the worker holds: ~130k once pandas, pyarrow and the engine
are imported, nearly all of them modules' functions, types and dicts that live as long as the
worker. In the engine's query at 1M clients (``local[2]``, batches of 370k events) each of those
collections took 55-210 ms, and a micro-batch runs about ten tasks (read, state and sink, per
core): about a second of the workers' time in each batch, in work that found a few dozen objects to
free.

:func:`freeze_imports`, called as an engine task starts, moves what the worker holds into the
permanent generation (``gc.freeze``), which collections skip; they then take well under a
millisecond. A frozen object is never collected, so the engine freezes only after the worker
imported modules it had not frozen yet: a few times in a worker's life, each after a collection,
so that what it freezes besides modules is the live part of the task that triggered it, once.

The freeze happens in the worker, not in the daemon before it forks: the daemon imports no
pandas or pyarrow on purpose, as both start threads when imported (``pyspark/daemon.py``).
"""

from __future__ import annotations

import gc
import sys


class _Freezer:
    def __init__(self) -> None:
        #: How many modules the process had imported at its last freeze.
        self.modules_at_freeze = 0

    def __call__(self) -> bool:
        """Freezes this process's objects if it imported modules since the last freeze;
        whether it did."""
        if len(sys.modules) == self.modules_at_freeze:
            return False
        gc.collect()
        gc.freeze()
        self.modules_at_freeze = len(sys.modules)
        return True


freeze_imports = _Freezer()
