"""The Python workers' heap: garbage collections kept to the objects a task made, and freed
memory kept for the next batch instead of returned to the system.

**Collections.** PySpark's daemon runs a full ``gc.collect()`` in a reused Python worker after
every task, and a full collection walks every object the worker holds: ~130k once pandas, pyarrow
and the engine are imported, nearly all of them modules' functions, types and dicts that live as
long as the worker. In the engine's query at 1M clients (``local[2]``, batches of 370k events) each
of those collections took 55-210 ms, and a micro-batch runs about ten tasks (read, state and sink,
per core): about a second of the workers' time in each batch, in work that found a few dozen
objects to free.

:func:`freeze_imports`, called as an engine task starts, moves what the worker holds into the
permanent generation (``gc.freeze``), which collections skip; they then take well under a
millisecond. A frozen object is never collected, so the engine freezes only after the worker
imported modules it had not frozen yet: a few times in a worker's life, each after a collection,
so that what it freezes besides modules is the live part of the task that triggered it, once.

The freeze happens in the worker, not in the daemon before it forks: the daemon imports no
pandas or pyarrow on purpose, as both start threads when imported (``pyspark/daemon.py``).

**Freed memory.** Each batch allocates and frees the same large buffers (numpy columns through
glibc's ``malloc``, Arrow's through the mimalloc pool pyarrow ships). By default both hand freed
memory back to the system soon after: glibc trims its heap when more than twice its adaptive
mmap threshold (at most 64 MiB) lies free at the top, and mimalloc purges a freed page after
10 ms. The next batch then faults every page in again, zeroed by the kernel. At 1M clients
(batches of 370k events) the workers took ~170k page faults a batch and spent 0.4-0.6 s of
their ~3.4 s of CPU in the kernel. :data:`ALLOCATOR_ENV`, which :func:`local_spark
<streaming.engine.job.local_spark>` gives the workers' environment, keeps it: glibc's threshold
fixed at its 32 MiB maximum and its heap trimmed only beyond 1 GiB free, mimalloc's pages purged
after 10 s unused. Measured in docs/streaming.md: ~20k faults a batch, ~0.2 s in the kernel, the
workers' resident memory ~2.05 -> ~2.4 GB.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Mapping
from typing import Final

#: Environment of the Python workers (read by glibc and by pyarrow's mimalloc as a process
#: starts): freed memory kept for the next batch. An operator's own ``spark.executorEnv.*``
#: settings of the same names win.
ALLOCATOR_ENV: Final[Mapping[str, str]] = {
    "MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024),
    "MALLOC_TRIM_THRESHOLD_": str(1024 * 1024 * 1024),
    "MIMALLOC_PURGE_DELAY": "10000",
}


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
