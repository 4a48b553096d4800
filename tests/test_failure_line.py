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
