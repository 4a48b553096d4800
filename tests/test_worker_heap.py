"""A worker's heap frozen once its modules are imported (streaming/engine/worker_heap.py), in a
process of its own: freezing is for the life of a process."""

from __future__ import annotations

import json
import subprocess
import sys

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
