"""``__remote_log_metadata`` decoded by Kafka's own schemas (quotastream/brokers/
remote_log_metadata.py), against Kafka's own decoder on a real 3-node cluster with tiered storage.

The oracle is ``RemoteLogMetadataSerde`` itself (tests/java/RemoteLogMetadataOracle.java, run as a
single-file Java program on the cluster's jars): it decodes the same values and prints each field
through Kafka's getters; the test renders its own decoding the same way."""

from __future__ import annotations

import re
import struct
import subprocess
import time
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from quotastream.brokers.remote_log_metadata import (
    PARTITION_DELETE,
    PARTITION_DELETE_STATES,
    SEGMENT,
    SEGMENT_STATES,
    SEGMENT_UPDATE,
    RemoteLogMetadataSchemas,
    UndecodableRecordError,
    kafka_uuid,
)
from quotastream.brokers.segments import SegmentLifecycle
from quotastream.publisher import batched_messages
from state.event_contract import RemoteCopy, RemoteSegment
from state.events import parse_events
from streaming.kafka_broker import KafkaCluster, kafka_libs, kafka_version
from tests.support.remote_log import metadata_values

ORACLE = Path(__file__).with_name("java") / "RemoteLogMetadataOracle.java"


@pytest.fixture(scope="module")
def schemas() -> RemoteLogMetadataSchemas:
    libs = kafka_libs()
    return RemoteLogMetadataSchemas.from_jar(libs / f"kafka-storage-{kafka_version(libs)}.jar")


def render(schemas: RemoteLogMetadataSchemas, value: bytes) -> str:
    """The decoded record as the oracle prints Kafka's (see RemoteLogMetadataOracle.java)."""
    decoded = schemas.decode(value)
    m = decoded.message

    def partition(p: Any) -> str:
        return f"{p.name} {kafka_uuid(p.id)} {p.partition}"

    def segment_id(s: Any) -> str:
        return f"{partition(s.topic_id_partition)} {kafka_uuid(s.id)}"

    def custom(value: bytes | None) -> str:
        return "-" if value is None else bytes(value).hex()

    def line(*words: object) -> str:
        return " ".join(str(word) for word in words)

    if decoded.name == SEGMENT:
        epochs = ",".join(f"{e.leader_epoch}={e.offset}" for e in m.segment_leader_epochs)
        return line(
            "segment",
            segment_id(m.remote_log_segment_id),
            m.start_offset,
            m.end_offset,
            m.broker_id,
            m.max_timestamp_ms,
            m.event_timestamp_ms,
            epochs,
            m.segment_size_in_bytes,
            SEGMENT_STATES[m.remote_log_segment_state],
            custom(m.custom_metadata),
            str(bool(m.txn_index_empty)).lower(),
        )
    if decoded.name == SEGMENT_UPDATE:
        return line(
            "update",
            segment_id(m.remote_log_segment_id),
            m.broker_id,
            m.event_timestamp_ms,
            SEGMENT_STATES[m.remote_log_segment_state],
            custom(m.custom_metadata),
        )
    if decoded.name == PARTITION_DELETE:
        return line(
            "partition_delete",
            partition(m.topic_id_partition),
            m.broker_id,
            m.event_timestamp_ms,
            PARTITION_DELETE_STATES[m.remote_partition_delete_state],
        )
    return f"other {decoded.name}"


def kafka_renders(values: list[bytes]) -> list[str]:
    """What Kafka's own ``RemoteLogMetadataSerde`` decodes ``values`` to."""
    result = subprocess.run(
        ["java", "-cp", f"{kafka_libs()}/*", str(ORACLE)],
        input="".join(f"{value.hex()}\n" for value in values),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout.splitlines()


def segment_states(lines: list[str]) -> dict[str, list[str]]:
    """Each segment's states in order, from the rendered records (its id is the fifth word)."""
    states: dict[str, list[str]] = {}
    for line in lines:
        words = line.split()
        if words[0] == "segment":
            states.setdefault(words[4], []).append(words[-3])
        elif words[0] == "update":
            states.setdefault(words[4], []).append(words[-2])
    return states


def await_segments(
    schemas: RemoteLogMetadataSchemas,
    address: str,
    done: Callable[[dict[str, list[str]]], bool],
    timeout_s: float = 60,
) -> list[bytes]:
    """Until the segments' states in ``__remote_log_metadata`` are ``done``; its values then."""
    deadline = time.monotonic() + timeout_s
    while True:
        values = metadata_values(address)
        states = segment_states([render(schemas, value) for value in values])
        if done(states):
            return values
        assert time.monotonic() < deadline, f"segments' states in {timeout_s} s: {states}"
        time.sleep(0.5)


def test_every_record_of_a_segments_life_decodes_as_kafka_decodes_it(
    schemas: RemoteLogMetadataSchemas, tiered_cluster: KafkaCluster
) -> None:
    """Segments rolled every second are uploaded (copy started, then finished); deleting the
    topic deletes each of them (delete started, then finished): every record, decoded here,
    equals Kafka's own decoding of it. (Kafka 4.3.1 writes no partition-delete record when a
    topic is deleted: each segment's own records say it is gone; and an upload the deletion
    interrupts stays started for good.)"""
    address = tiered_cluster.address
    admin = KafkaAdminClient(bootstrap_servers=address)
    topic = "tiered"
    configs = {
        "remote.storage.enable": "true",
        "segment.ms": "1000",
        "local.retention.ms": "1000",
    }
    admin.create_topics([NewTopic(topic, 3, 3, topic_configs=configs)])
    producer = KafkaProducer(bootstrap_servers=address, acks="all", linger_ms=5)
    for _ in range(30):  # 3 s: each partition rolls two or three segments
        for partition in range(3):
            producer.send(topic, b"x" * 1_000, partition=partition)
        producer.flush()
        time.sleep(0.1)
    producer.close()
    copied = ["COPY_SEGMENT_STARTED", "COPY_SEGMENT_FINISHED"]
    await_segments(schemas, address, lambda states: len(states) >= 3)
    admin.delete_topics([topic])
    admin.close()
    # Every segment uploaded is then deleted. One whose upload the deletion interrupted stays
    # started, and is never finished or deleted.
    deleted = [*copied, "DELETE_SEGMENT_STARTED", "DELETE_SEGMENT_FINISHED"]
    values = await_segments(
        schemas,
        address,
        lambda states: all(s in (deleted, copied[:1]) for s in states.values()),
    )

    ours = [render(schemas, value) for value in values]
    assert ours == kafka_renders(values)
    states = segment_states(ours)
    assert len(states) >= 3

    # The engine's events of them: each upload counted from its finish to its deletion's, and
    # each upload's start a remote_copy of the segment's size.
    lifecycle = SegmentLifecycle()
    made = [event for value in values for event in lifecycle.apply(schemas.decode(value))]
    segments = [e for e in made if isinstance(e, RemoteSegment)]
    assert sorted((e.segment_id, e.state) for e in segments) == sorted(
        (segment, state)
        for segment, lived in states.items()
        if lived == deleted
        for state in ("copy_finished", "delete_finished")
    )
    assert sum(isinstance(e, RemoteCopy) for e in made) == len(states)
    assert len(lifecycle) == sum(lived == copied[:1] for lived in states.values())
    # ... and the engine's validator accepts every one (one batched message).
    parsed = parse_events([message.value for message in batched_messages(made, 1 << 20)])
    assert parsed.rejected.empty, parsed.rejected.to_dict("records")
    assert len(parsed.accepted) == len(made)


# --- what is refused, and why: a value Kafka's serde wrote, altered -----------------------------


def partition_delete_value(topic_id: uuid.UUID) -> bytes:
    """``RemotePartitionDeleteMetadata(t1-3, DELETE_PARTITION_MARKED, ts, broker 2)`` as
    ``RemoteLogMetadataSerde`` serialises it (Kafka 4.3.1): frame 1, api key 2, version 0, then
    the flexible message."""
    return (
        bytes([1, 2, 0])
        + bytes([3])  # compact string "t1": length + 1
        + b"t1"
        + topic_id.bytes
        + struct.pack(">i", 3)
        + b"\x00"  # TopicIdPartition's tagged fields
        + struct.pack(">iq", 2, 1_700_000_000_000)
        + b"\x00"  # DELETE_PARTITION_MARKED
        + b"\x00"  # the record's tagged fields
    )


def test_a_record_kafka_wrote_decodes(schemas: RemoteLogMetadataSchemas) -> None:
    topic_id = uuid.uuid4()
    decoded = schemas.decode(partition_delete_value(topic_id))
    assert (decoded.name, decoded.version) == (PARTITION_DELETE, 0)
    assert decoded.message.topic_id_partition.id == topic_id
    assert render(schemas, partition_delete_value(topic_id)) == (
        f"partition_delete t1 {kafka_uuid(topic_id)} 3 2 1700000000000 DELETE_PARTITION_MARKED"
    )


@pytest.mark.parametrize(
    ("alter", "reason"),
    [
        (lambda v: bytes([0]) + v[1:], "frame version 0, not 1"),
        (lambda v: v[:1] + bytes([9]) + v[2:], "api key 9, which no schema of this release has"),
        (lambda v: v[:2] + bytes([1]) + v[3:], "version 1; this release's schema has 0..0"),
        (lambda v: v + b"\x00", "bytes after the end of its RemotePartitionDeleteMetadataRecord"),
        (lambda v: v[:10], "a malformed RemotePartitionDeleteMetadataRecord"),
        (lambda v: b"\x01", "a truncated frame header"),
        (lambda v: None, "a record without a value"),
    ],
    ids=["frame", "api-key", "version", "trailing", "truncated", "no-header", "null"],
)
def test_a_record_these_schemas_do_not_describe_is_refused_with_the_reason(
    schemas: RemoteLogMetadataSchemas, alter: Any, reason: str
) -> None:
    with pytest.raises(UndecodableRecordError, match=re.escape(reason)):
        schemas.decode(alter(partition_delete_value(uuid.uuid4())))


def test_a_jar_without_the_schemas_is_refused(tmp_path: Path) -> None:
    jar = tmp_path / "kafka-clients.jar"
    with zipfile.ZipFile(jar, "w") as archive:
        archive.writestr("message/Other.json", "{}")
    with pytest.raises(
        ValueError, match=re.escape("has no message/RemoteLogSegmentMetadataRecord.json")
    ):
        RemoteLogMetadataSchemas.from_jar(jar)
    with pytest.raises(ValueError, match="cannot read Kafka's schemas"):
        RemoteLogMetadataSchemas.from_jar(tmp_path / "missing.jar")
