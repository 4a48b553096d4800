"""The Kafka source's Python process on the driver, and how its end is reported.

Spark drives a Python streaming source from the driver through one Python process per query
(``pyspark.sql.streaming.python_streaming_source_runner``, started by the JVM's
``PythonStreamingSourceRunner``): the process creates the source's reader
(:class:`streaming.engine.kafka_source.KafkaStreamReader`), then answers each call the JVM sends
over a socket (``initialOffset``, ``latestOffset``, ``partitions``, ``commit``, ...), one at a
time, for the query's life. Reading the runner on both sides (pyspark 4.3.0):

* An exception that escapes the reader, ``MemoryError`` included, is caught by the runner's
  ``except BaseException``, sent as ``PYTHON_EXCEPTION_THROWN`` with its traceback, and the
  process exits. The JVM raises it as ``PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR``: the query
  fails naming the error (``streaming.commands.run.failure_line``).
* The JVM reads each answer with a bare ``DataInputStream.readInt``, without a timeout, so it
  never gives up on a slow answer: load alone cannot end the exchange.
* So ``java.io.EOFException`` in ``PythonStreamingSourceRunner.<call>`` (or a broken pipe or
  reset connection when the JVM writes its next call) means the process ended without a word:
  killed by a signal (SIGKILL, as the kernel's out-of-memory killer sends it, or SIGTERM, whose
  default action ends a process silently), or crashed in native code (SIGSEGV, an abort). The
  runner also writes nothing when formatting the error fails (an unencodable message, memory
  exhausted while formatting): it prints to stderr and exits. Spark then reports
  ``[STREAM_FAILED] ... terminated with exception:`` with no message at all.

What quotastream does about it: in that process (and only there) :func:`watch_source_process`
turns SIGTERM into an exception, which the runner reports like any other error, naming the
signal, and enables :mod:`faulthandler`, so that a crash leaves its Python stack on the process's
stderr, which the JVM copies into the driver's log. A SIGKILL cannot be seen from inside:
:func:`source_process_ended` recognizes the end from the JVM's stack trace and says what
happened, for ``quotastream run``'s one-line failure. The query's checkpoint is intact either
way: a restart resumes where it stopped.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import sys
from types import FrameType
from typing import Final

#: The module Spark runs the source's driver-side process as (``python -m ...``).
RUNNER_MODULE: Final = "pyspark.sql.streaming.python_streaming_source_runner"

#: A JVM stack trace's cause that ended a call of the runner: an I/O error on the process's
#: socket (``EOFException``: it closed; ``IOException: Broken pipe``, ``SocketException:
#: Connection reset``), and the runner's call it interrupted.
_ENDED_IN_CALL: Final = re.compile(
    r"Caused by: java\.(?:io|net)\.\w+(?:: [^\n]*)?\n"
    r"(?:\s+at [^\n]*\n)*?"
    r"\s+at org\.apache\.spark\.sql\.execution\.python\.streaming\.PythonStreamingSourceRunner"
    r"\.(\w+)\("
)


class SourceProcessSignalError(RuntimeError):
    """The source's process on the driver was sent a signal that ends it."""


def watch_source_process() -> None:
    """In Spark's source process on the driver (and nowhere else: a test or a read may build a
    reader too), name the end of the process: SIGTERM raises :class:`SourceProcessSignalError`
    (reported by the runner as the source's error), a crash writes its Python stack to stderr."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is None or spec.name != RUNNER_MODULE:
        return
    faulthandler.enable()
    signal.signal(signal.SIGTERM, _signalled)


def _signalled(signum: int, frame: FrameType | None) -> None:
    raise SourceProcessSignalError(
        f"the Kafka source's Python process on the driver (pid {os.getpid()}) was sent "
        f"{signal.Signals(signum).name}: something outside the query stopped it"
    )


def source_process_ended(error: BaseException) -> str | None:
    """What happened, when ``error`` (a failed query's) is the source's process on the driver
    ending without a word; None for any other error."""
    # pyspark keeps the JVM's stack trace, causes included, only in this attribute (its str()
    # has it only with spark.sql.pyspark.jvmStacktrace.enabled).
    trace = getattr(error, "_stackTrace", None) or str(error)
    found = _ENDED_IN_CALL.search(trace)
    if found is None:
        return None
    return (
        "the Kafka source's Python process on the driver ended without an error while Spark "
        f"waited for its {found.group(1)}: killed by a signal it cannot catch (SIGKILL, as the "
        "kernel's out-of-memory killer sends it) or crashed (then its stack is in the driver's "
        "log); the checkpoint is intact: a restart resumes from it"
    )
