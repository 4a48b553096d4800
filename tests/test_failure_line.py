"""``quotastream run`` reports a failed query in one line: the error the engine raised."""

from __future__ import annotations

import pytest

from streaming.commands.run import failure_line

SPARK_TEXT = """[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data \
source perform latestOffset: Traceback (most recent call last):
  File "pyspark/sql/streaming/python_streaming_source_runner.py", line 281, in main
  File "/work/main/quotastream/outage.py", line 107, in failed
    raise OutageError(
{raised} SQLSTATE: 38000 SQLSTATE: XXKST
=== Streaming Query ===
Identifier: quotastream
Current Committed Offsets: {{...}}
"""


@pytest.mark.parametrize(
    ("raised", "line"),
    [
        (
            "quotastream.outage.OutageError: Kafka at h:9092 unreachable for more than 4 s "
            "(4 failed attempts): KafkaConnectionError: 111 ECONNREFUSED",
            "Kafka at h:9092 unreachable for more than 4 s (4 failed attempts): "
            "KafkaConnectionError: 111 ECONNREFUSED",
        ),
        (
            "streaming.engine.kafka_source.DataLossError: e-0: the next offset to read is 100 but "
            "the log ends at 2; records the query has not read are gone (failOnDataLoss=true)",
            "e-0: the next offset to read is 100 but the log ends at 2; records the query has "
            "not read are gone (failOnDataLoss=true)",
        ),
        # Not the engine's own: the kind of error stays in the line.
        ("KeyError: 'limit'", "KeyError: 'limit'"),
        (
            "kafka.errors.TopicAuthorizationFailedError: [Error 29]",
            "TopicAuthorizationFailedError: [Error 29]",
        ),
    ],
)
def test_the_line_is_the_error_that_ends_the_workers_traceback(raised: str, line: str) -> None:
    assert failure_line(RuntimeError(SPARK_TEXT.format(raised=raised))) == line


def test_an_error_without_a_traceback_is_its_first_line() -> None:
    assert failure_line(RuntimeError("stopped\nmore detail")) == "stopped"


#: A failed query's JVM stack trace (what pyspark keeps as ``_stackTrace``), abridged: Spark's
#: own error says nothing of why.
JVM_TRACE = """org.apache.spark.sql.streaming.StreamingQueryException: [STREAM_FAILED] Query [id = \
q, runId = r] terminated with exception:  SQLSTATE: XXKST (no cause message)
=== Streaming Query ===
\tat org.apache.spark.sql.execution.streaming.runtime.StreamExecution.runStream(StreamExecution.\
scala:394)
Caused by: {cause}
\tat java.base/java.io.DataInputStream.readInt(DataInputStream.java:386)
\tat org.apache.spark.sql.execution.python.streaming.{runner}.latestOffset(\
PythonStreamingSourceRunner.scala:217)
\tat org.apache.spark.sql.execution.datasources.v2.python.PythonMicroBatchStreamBase.latestOff\
set(PythonMicroBatchStream.scala:60)
"""


class CapturedError(Exception):
    """pyspark's captured JVM error: a message, and the JVM's stack trace apart."""

    def __init__(self, message: str, trace: str) -> None:
        super().__init__(message)
        self._stackTrace = trace


@pytest.mark.parametrize(
    "cause",
    [
        "java.io.EOFException",
        "java.io.IOException: Broken pipe",
        "java.net.SocketException: Connection reset",
    ],
)
def test_the_sources_process_ending_without_an_error_is_named(cause: str) -> None:
    error = CapturedError(
        "[STREAM_FAILED] Query [id = q, runId = r] terminated with exception:  SQLSTATE: XXKST",
        JVM_TRACE.format(cause=cause, runner="PythonStreamingSourceRunner"),
    )
    assert failure_line(error).startswith(
        "the Kafka source's Python process on the driver ended without an error while Spark "
        "waited for its latestOffset: killed by a signal it cannot catch (SIGKILL, "
    )


def test_an_end_of_stream_elsewhere_is_not_taken_for_the_sources_process() -> None:
    trace = JVM_TRACE.format(cause="java.io.EOFException", runner="SomeOtherRunner")
    error = CapturedError("[STREAM_FAILED] Query terminated with exception: x", trace)
    assert failure_line(error) == "[STREAM_FAILED] Query terminated with exception: x"
