"""A worker's heap frozen once its modules are imported (streaming/engine/worker_heap.py), in a
process of its own: freezing is for the life of a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping

import pandas as pd
from pyspark.sql import SparkSession

from streaming.engine.worker_heap import ALLOCATOR_ENV
from tests.servers import ROOT

#: What a Python worker imports for a state task, then three engine tasks' starts, with a module
#: first imported between the second and the third; prints what each saw.
WORKER = """
import gc, json, sys
import streaming.engine.job
from streaming.engine.worker_heap import freeze_imports

walked_before = len(gc.get_objects())
first = freeze_imports()
walked_after = len(gc.get_objects())
second = freeze_imports()
assert "wave" not in sys.modules
import wave
third = freeze_imports()
print(json.dumps({
    "walked_before": walked_before, "walked_after": walked_after,
    "frozen": gc.get_freeze_count(), "freezes": [first, second, third],
}))
"""


def test_a_worker_freezes_its_imports_and_again_only_after_new_ones() -> None:
    run = subprocess.run(
        [sys.executable, "-c", WORKER], cwd=ROOT, capture_output=True, text=True, check=True
    )
    seen = json.loads(run.stdout)
    assert seen["freezes"] == [True, False, True]
    # What the daemon's collection after each task walks: the objects made since, not the
    # libraries' (over 100k with pandas and pyarrow).
    assert seen["walked_before"] > 50_000
    assert seen["walked_after"] < seen["walked_before"] // 20
    assert seen["frozen"] >= seen["walked_before"] * 0.9


#: Five batches that each allocate and free ~100 MB the way a state task does (numpy columns
#: through malloc; an Arrow IPC stream written and read back zstd-compressed, through Arrow's
#: pool), after one that warms up; prints the page faults the five took, per kind.
#: Arrow's own threads are left out: each draws from its own mimalloc heap, and which thread
#: takes a buffer is the scheduler's choice, so on a loaded machine a batch could land on a
#: thread whose heap the warm-up never reached (threaded: 6-9 faults, and 77 in 1 of 16 runs
#: beside two busy processes, 954 once under `-n 2`; on one thread: 0 in all 24). What is
#: measured is whether the allocator keeps a heap's freed pages, not how work meets threads.
BATCHES = """
import json, resource, time
import numpy as np, pyarrow as pa

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

column = pa.chunked_array([pa.array(np.arange(2_000_000, dtype=np.int64)) for _ in range(8)])
compressed = pa.ipc.IpcWriteOptions(compression="zstd", use_threads=False)
one_thread = pa.ipc.IpcReadOptions(use_threads=False)

def numpy_batch():
    columns = [np.ones(1_000_000) for _ in range(12)]
    del columns

def arrow_batch():
    table = pa.table({"a": column})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=compressed) as writer:
        writer.write_table(table, max_chunksize=2_000_000)
    pa.ipc.open_stream(sink.getvalue(), options=one_thread).read_all()

seen = {}
for name, batch in (("numpy", numpy_batch), ("arrow", arrow_batch)):
    batch()
    before = faults()
    for _ in range(5):
        time.sleep(0.03)  # longer than mimalloc's default purge delay (10 ms)
        batch()
    seen[name] = faults() - before
print(json.dumps(seen))
"""


def _faults(environment: Mapping[str, str]) -> dict[str, int]:
    inherited = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_ENV}
    run = subprocess.run(
        [sys.executable, "-c", BATCHES],
        env={**inherited, **environment},
        capture_output=True,
        text=True,
        check=True,
    )
    faults: dict[str, int] = json.loads(run.stdout)
    return faults


def test_the_workers_allocators_keep_freed_memory_for_the_next_batch() -> None:
    shipped = _faults(ALLOCATOR_ENV)
    default = _faults({})
    # Each batch's ~100 MB come back without faulting pages in again (a page is 4 KiB: 100
    # faults is under half a megabyte over five batches), for numpy and for Arrow alike.
    assert shipped["numpy"] < 100, shipped
    assert shipped["arrow"] < 100, shipped
    # ... where the allocators' defaults fault them in again each batch.
    assert sum(default.values()) > 10 * max(100, sum(shipped.values())), (default, shipped)


def _environment(rows: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    for _ in rows:
        yield pd.DataFrame(
            {"name": list(ALLOCATOR_ENV), "value": [os.environ.get(n) for n in ALLOCATOR_ENV]}
        )


def test_the_engines_python_workers_run_with_the_allocator_settings(spark: SparkSession) -> None:
    seen = spark.range(1).mapInPandas(_environment, "name string, value string").collect()
    assert {row.name: row.value for row in seen} == ALLOCATOR_ENV
