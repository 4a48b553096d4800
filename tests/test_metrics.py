"""The engine's metrics without Spark: the bounded exported set, the writer summary, exposition."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from quotastream.redis_contract import Decision, decode_decision
from state.config import parse_quota_config
from state.configfile import ConfigError
from state.events import EventBounds
from streaming.engine import metric_names as names
from streaming.engine.batch_summary import BatchSummary, SummaryRequest
from streaming.engine.exported_entities import ExportedEntities
from streaming.engine.exporter import EngineMetrics, KafkaEnds
from streaming.engine.metric_names import METRICS
from streaming.engine.settings import EngineSettings, load_engine_settings
from streaming.engine.shard_layout import ShardLayout
from streaming.engine.source_records import KafkaRecords
from streaming.engine.stages import DECISION, DECISION_SCHEMA, StageSettings, update_shard
from streaming.services import LocalService
from tests.support.agents import FakeClock
from tests.support.engine import publish
from tests.support.factories import (
    BASE,
    MIXED_QUOTAS,
    decision_row,
    fetch,
    produce,
    remote,
    remote_segment,
    replication,
)
from tests.support.prometheus import samples
from tests.support.stage_runs import shard_inputs

NOW = 1_700_000_000_000


def decision(
    entity: str,
    rate: float,
    limit: float | None = 1000.0,
    *,
    quota: str = "produce",
    throttle_ms: int = 0,
    until: int | None = None,
    released_at: int | None = None,
    mode: str = "enforced",
    ts: int = NOW,
) -> Decision:
    return Decision(
        quota=quota,
        entity=entity,
        throttle_ms=throttle_ms,
        until=ts + throttle_ms if until is None else until,
        rate=rate,
        limit=limit,
        exceeded=limit is not None and rate > limit,
        window_ms=11_000,
        decided_at=ts,
        enforced=mode == "enforced",
        mode=mode,
        released_at=released_at,
    )


def labels_of(key: str) -> dict[str, str]:
    """The labels of one sample, from its ``{name="value",...}`` text."""
    return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', key))


def per_entity(text: str, name: str) -> dict[tuple[str, str], float]:
    """``{(quota, entity): value}`` of one per-entity metric in the exposition text."""
    found = {}
    for key, value in samples(text, name).items():
        labels = labels_of(key)
        found[labels["quota"], labels["entity"]] = value
    return found


def test_the_exported_set_is_bounded_by_top_k_per_quota_plus_the_throttled() -> None:
    state = ExportedEntities(top_k=10)
    quiet = [decision(f"user=u{i},broker=1", rate=float(i % 900)) for i in range(10_000)]
    fetches = [decision(f"user=u{i},broker=1", rate=float(i), quota="fetch") for i in range(10_000)]
    throttled = [
        decision(f"user=hot{i},broker=1", rate=2000.0 + i, throttle_ms=5000) for i in range(25)
    ]
    state.fold([*quiet, *fetches, *throttled], NOW)
    exported = state.exported(NOW)
    per_quota = {q: [d for d in exported if d.quota == q] for q in ("produce", "fetch")}
    assert len(per_quota["fetch"]) == 10
    # The 10 highest fetch utilisations, and the top 10 produce ones are all throttled ones.
    assert {d.entity for d in per_quota["fetch"]} == {
        f"user=u{i},broker=1" for i in range(9990, 10_000)
    }
    assert len(per_quota["produce"]) == 25
    assert all(d.throttle_ms_at(NOW) > 0 for d in per_quota["produce"])
    # The driver forgets everything else; what the writers must keep returning is bounded too.
    assert len(state.entities) == 35
    assert len(state.tracked()) == 35
    assert state.throttled(NOW)["produce"] == 25


def test_entities_leaving_the_set_disappear_from_the_exposition() -> None:
    metrics = EngineMetrics(top_k=2, port=0)
    first = [decision("user=a", 900.0), decision("user=b", 800.0), decision("user=c", 100.0)]
    metrics.state.fold(first, NOW)
    assert {d.entity for d in metrics.state.exported(NOW)} == {"user=a", "user=b"}
    # c overtakes b: b's series go.
    metrics.state.fold([decision("user=c", 950.0)], NOW + 1000)
    text = metrics.scrape()
    rates = per_entity(text, names.BYTE_RATE)
    assert set(rates) == {("produce", "user=a"), ("produce", "user=c")}
    assert "user=b" not in text


def test_a_released_throttle_leaves_the_set_and_its_throttle_time_is_zero_meanwhile() -> None:
    state = ExportedEntities(top_k=0)
    pending = decision("user=slow", 5000.0, throttle_ms=8000)
    state.fold([pending], NOW)
    assert state.throttled(NOW)["produce"] == 1
    assert state.exported(NOW) == []  # top_k 0: no per-entity series, the count remains
    assert state.throttled(NOW + 8000)["produce"] == 0  # over, even before its release row
    released = decision("user=slow", 5000.0, throttle_ms=8000, released_at=NOW + 8000)
    state.fold([released], NOW + 9000)
    assert state.entities == {}


def test_unlimited_entities_have_no_limit_or_utilisation_series() -> None:
    metrics = EngineMetrics(top_k=5, port=0)
    metrics.state.fold(
        [
            decision("user=free", 10_000.0, limit=None),
            decision("user=capped", 500.0, limit=1000.0),
        ],
        NOW,
    )
    text = metrics.scrape()
    assert set(per_entity(text, names.BYTE_RATE)) == {
        ("produce", "user=free"),
        ("produce", "user=capped"),
    }
    assert set(per_entity(text, names.QUOTA_LIMIT)) == {("produce", "user=capped")}
    assert per_entity(text, names.QUOTA_UTILISATION) == {("produce", "user=capped"): 0.5}


def test_shadow_and_released_decisions_are_not_throttled() -> None:
    shadow = decision("user=s", 3000.0, throttle_ms=4000, mode="shadow")
    released = decision("user=r", 3000.0, throttle_ms=4000, released_at=NOW)
    enforced = decision("user=e", 3000.0, throttle_ms=4000)
    assert (shadow.throttle_ms_at(NOW), released.throttle_ms_at(NOW)) == (0, 0)
    assert enforced.throttle_ms_at(NOW + 1000) == 3000


def test_entities_not_decided_for_keep_ms_are_forgotten_unless_throttled() -> None:
    state = ExportedEntities(top_k=10, keep_ms=30_000)
    state.fold([decision("user=old", 10.0), decision("user=held", 9000.0, throttle_ms=60_000)], NOW)
    state.fold([decision("user=new", 5.0)], NOW + 31_000)
    assert {entity for _, entity in state.entities} == {"user=held", "user=new"}


def writer_summary(
    written: pa.RecordBatch, request: SummaryRequest, written_at: int
) -> list[dict[str, Any]]:
    """What ``write_batches`` returns for one written batch, without Redis: its summary rows."""
    summary = BatchSummary(request, written_at)
    is_decision = pc.equal(written.column("row_type"), DECISION)
    decisions = written.filter(is_decision)
    summary.decisions_of(decisions, pc.sum(decisions.column("write")).as_py() or 0)
    for row in written.filter(pc.invert(is_decision)).to_pylist():
        summary.add_other(row)
    rows: list[dict[str, Any]] = summary.batch().to_pylist()
    return rows


def test_a_writer_summary_keeps_top_k_throttled_and_tracked_rows_only() -> None:
    request = SummaryRequest(top_k=3, tracked=frozenset({"produce\x00user=tracked"}))
    # The metrics see every decision, written to Redis or not (docs/redis.md).
    rows = [
        decision_row(f"user=u{i}", NOW, rate=float(i), config_version=3, write=i >= 900)
        for i in range(1000)
    ]
    rows.append(decision_row("user=tracked", NOW - 10, rate=0.5, config_version=3, write=False))
    rows.append(decision_row("user=hot", NOW, 9000, rate=5000.0, config_version=3))
    rows.append({**dict.fromkeys(DECISION_SCHEMA.names), "row_type": "reject", "reason": "x"})
    rows.append({**dict.fromkeys(DECISION_SCHEMA.names), "row_type": "reject", "reason": "x"})
    timers = {"timers_pending": 1, "timers_fired": 4, "timers_cancelled": 2}
    rows.append(
        {**dict.fromkeys(DECISION_SCHEMA.names), "row_type": "timers", "shard": 2, **timers}
    )
    written = pa.RecordBatch.from_pylist(rows, schema=DECISION_SCHEMA)
    out = writer_summary(written, request, written_at=NOW + 250)
    kept = {decode_decision("-", row["value"]).entity for row in out if row["kind"] == "decision"}
    assert kept == {"user=tracked", "user=hot", "user=u999", "user=u998", "user=u997"}
    (head,) = [row for row in out if row["kind"] == "summary"]
    assert (head["decisions"], head["decided"], head["rejects"]) == (101, 1002, 2)
    assert head["config_version"] == 3
    assert head["written_at"] - head["newest_ts"] == 250

    metrics = EngineMetrics(top_k=3, port=0, clock=FakeClock(wall_ms=NOW + 300))
    metrics.record_batch(out)
    text = metrics.scrape()
    assert samples(text, names.DEAD_LETTER_EVENTS) == {'{reason="x"}': 2.0}
    assert samples(text, names.TIMERS_FIRED) == {"": 4.0}
    assert samples(text, names.TIMERS_PENDING) == {"": 1.0}
    assert samples(text, names.EVENT_LAG) == {"": 0.25}
    assert samples(text, names.CONFIG_VERSION) == {"": 3.0}
    assert samples(text, names.DECISIONS) == {'{written="true"}': 101.0, '{written="false"}': 901.0}
    throttle = per_entity(text, names.THROTTLE_TIME)
    assert 0 < throttle["produce", "user=hot"] <= 9.0
    # A shard's counts are cumulative: only the increase is counted again.
    timers_later = [
        {"kind": "timers", "shard": 2, "timers_pending": 0, "timers_fired": 5,
         "timers_cancelled": 2}
    ]  # fmt: skip
    metrics.record_batch(timers_later, now_ms=NOW + 1300)
    assert samples(metrics.scrape(), names.TIMERS_FIRED) == {"": 5.0}


def test_progress_feeds_the_batch_metrics() -> None:
    metrics = EngineMetrics(port=0)
    metrics.event_topics = ["events"]
    metrics.record_progress(
        {
            "timestamp": "2026-01-01T00:00:00.000Z",
            "durationMs": {"triggerExecution": 1500},
            "numInputRows": 7,  # the source's packs of staged rows: not what the input counts
            "inputRowsPerSecond": 21.0,
            "processedRowsPerSecond": 4.7,
            "sources": [
                {
                    "startOffset": {"events": {"0": 100, "1": 5}, "config": {"0": 3}},
                    # Partition 1 restarted (counted from 0), partition 2 is new.
                    "endOffset": {"events": {"0": 130, "1": 2, "2": 10}, "config": {"0": 9}},
                }
            ],
        }
    )
    text = metrics.scrape()
    assert samples(text, names.INPUT_EVENTS) == {"": 42.0}
    assert samples(text, f"{names.BATCH_DURATION}_count") == {"": 1.0}
    assert samples(text, names.PROCESSED_RECORDS_PER_SECOND) == {"": 42 / 1.5}
    assert samples(text, names.LAST_BATCH_TIMESTAMP) == {"": 1767225601.5}


def test_every_contract_name_is_exposed_with_its_labels() -> None:
    metrics = EngineMetrics(top_k=5, port=0, input_ends=lambda: {("t", 0): 12})
    metrics.state.fold([decision("user=a", 2000.0, throttle_ms=5000)], NOW)
    metrics.dead_letter.labels(reason="invalid_json").inc()
    metrics.remote_log_size.labels(topic="t", partition="0").set(1)
    metrics.record_progress(
        {
            "durationMs": {"triggerExecution": 10},
            "numInputRows": 0,
            "sources": [{"startOffset": {"t": {"0": 10}}, "endOffset": {"t": {"0": 3}}}],
        }
    )
    text = metrics.scrape()
    for name, (kind, labels) in METRICS.items():
        assert f"# TYPE {name} {kind}" in text, name
        exposed = samples(text, f"{name}_count" if kind == "histogram" else name)
        assert exposed, name
        for key in exposed:
            assert sorted(re.findall(r'(\w+)="', key)) == sorted(labels), (name, key)


def test_the_exporter_serves_a_dedicated_registry_on_loopback() -> None:
    first, second = EngineMetrics(port=0), EngineMetrics(port=0)
    port = first.serve()
    try:
        assert port > 0
        assert first.port == port
        assert second.registry is not first.registry
        import urllib.request  # noqa: PLC0415

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            assert names.TIMERS_PENDING in reply.read().decode()
    finally:
        first.close()


def test_metrics_settings_default_to_loopback_and_are_validated(tmp_path: Path) -> None:
    defaults = EngineSettings().metrics
    assert (defaults.enabled, defaults.host, defaults.port, defaults.top_k) == (
        True,
        "127.0.0.1",
        9464,
        100,
    )
    assert load_engine_settings(Path("conf/engine.yaml")).metrics == defaults
    for bad in ("port: 70000", "port: -1", "top_k: -1", "extra: 1"):
        path = tmp_path / "engine.yaml"
        path.write_text(f"metrics:\n  {bad}\n")
        with pytest.raises(ConfigError, match="metrics"):
            load_engine_settings(path)


def test_a_log_that_restarted_below_the_batch_start_is_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = EngineMetrics(port=0)
    # As PySpark's progress gives them: JSON text.
    source = {
        "startOffset": json.dumps({"events": {"0": 500, "1": 20}, "config": {"0": 2}}),
        "endOffset": json.dumps({"events": {"0": 40, "1": 25}, "config": {"0": 2}}),
    }
    metrics.record_progress({"durationMs": {}, "numInputRows": 40, "sources": [source]})
    # Another source's offsets (not this shape) and a batch without sources count nothing.
    metrics.record_progress({"sources": [{"startOffset": "12", "endOffset": "{not json"}]})
    text = metrics.scrape()
    assert samples(text, names.SOURCE_DATA_LOSS) == {'{partition="0",topic="events"}': 1.0}
    assert "events-0: the log restarted at 40 below offset 500" in caplog.text


def test_per_entity_series_carry_kafkas_label_names() -> None:
    """``sum by (user)`` and friends: each part of the entity key is a label of its own, under
    Kafka's tag name, empty where the entity has no such part; no series is added."""
    metrics = EngineMetrics(top_k=10, port=0)
    entities = {
        ("produce", "user=al%2Cice,client-id=app%3D1,broker=1"): {
            "user": "al,ice", "client_id": "app=1", "broker": "1", "topic": "", "partition": ""
        },
        ("produce", "user=bob,broker=2"): {
            "user": "bob", "client_id": "", "broker": "2", "topic": "", "partition": ""
        },
        ("fetch", "client-id=app2"): {
            "user": "", "client_id": "app2", "broker": "", "topic": "", "partition": ""
        },
        ("remote_copy", "broker=3,topic=orders,partition=7"): {
            "user": "", "client_id": "", "broker": "3", "topic": "orders", "partition": "7"
        },
        ("remote_fetch", "cluster"): {
            "user": "", "client_id": "", "broker": "", "topic": "", "partition": ""
        },
    }  # fmt: skip
    metrics.state.fold([decision(entity, 500.0, quota=quota) for quota, entity in entities], NOW)
    text = metrics.scrape()
    for name in (names.BYTE_RATE, names.QUOTA_LIMIT, names.QUOTA_UTILISATION, names.THROTTLE_TIME):
        exposed = {}
        for key in samples(text, name):
            labels = labels_of(key)
            exposed[labels.pop("quota"), labels.pop("entity")] = labels
        assert exposed == entities, name


def test_kafka_labels_add_no_series_beyond_the_bounded_set() -> None:
    metrics = EngineMetrics(top_k=3, port=0)
    metrics.state.fold(
        [
            decision(f"user=u{i % 50},client-id=c{i},broker={i % 7}", rate=float(i))
            for i in range(5_000)
        ],
        NOW,
    )
    rates = samples(metrics.scrape(), names.BYTE_RATE)
    assert len(rates) == 3
    assert {labels_of(key)["client_id"] for key in rates} == {"c4997", "c4998", "c4999"}


def test_the_input_backlog_is_end_offsets_asked_of_kafka_minus_the_offsets_read(
    kafka: LocalService,
) -> None:
    """Against a real broker: what Kafka holds beyond the last progress's offsets. Before any
    progress the backlog is unknown (absent), not 0: a stalled first batch is not an idle one."""
    topic = f"backlog-{uuid.uuid4().hex[:8]}"
    publish(kafka, topic, [b"{}"] * 10, partitions=2)
    ends = KafkaEnds(kafka.address, {}, [topic])
    metrics = EngineMetrics(port=0, input_ends=ends)
    try:
        assert samples(metrics.scrape(), names.INPUT_BACKLOG) == {}
        metrics.event_topics = [topic]
        read = {topic: {"0": 5, "1": 2}, "quotastream.config": {"0": 40}}
        metrics.record_progress({"sources": [{"startOffset": None, "endOffset": json.dumps(read)}]})
        assert samples(metrics.scrape(), names.INPUT_BACKLOG) == {"": 3.0}  # 5 + 5 - 5 - 2
        publish(kafka, topic, [b"{}"] * 4, partitions=2, create=False)
        assert samples(metrics.scrape(), names.INPUT_BACKLOG) == {"": 7.0}
        caught_up = {topic: {"0": 7, "1": 7}}
        metrics.record_progress({"sources": [{"startOffset": None, "endOffset": caught_up}]})
        assert samples(metrics.scrape(), names.INPUT_BACKLOG) == {"": 0.0}
    finally:
        metrics.close()


def test_requests_are_the_accepted_events_count_summed_per_quota() -> None:
    """Each event stands for ``count`` requests (default 1); the exporter counts them per quota
    over every shard and writer, and counts nothing for events of no quota or rejected ones."""
    quotas = parse_quota_config(MIXED_QUOTAS, "test config")
    stage = StageSettings(quotas, EventBounds(), 65_536)
    counted = [
        {**produce("alice", "app", 100, BASE), "count": 3},
        produce("bob", "app", 100, BASE + 1),
        {**fetch("alice", "app", 100, BASE + 2), "count": 5},
        {**remote("remote_copy", 1, 100, BASE + 3), "count": 2},
        {**replication(1, "leader", "t", 0, 2, True, 100, BASE + 4), "count": 6},
    ]
    batched = [  # one message, two events
        {**produce("carol", "app", 10, BASE + 5), "count": 2},
        {**fetch("bob", "app", 10, BASE + 5), "count": 4},
    ]
    uncounted = [
        # No quota measures a follower's fetch of a partition it does not throttle.
        {**replication(1, "follower", "u", 0, 2, True, 100, BASE + 6), "count": 8},
        {**remote_segment("t", 0, "s1", 100, "copy_finished", BASE + 7), "count": 9},
        {**produce("dave", "app", -1, BASE + 8), "count": 100},  # rejected: negative bytes
    ]
    values = [json.dumps(event).encode() for event in [*counted, *uncounted]]
    values.append(json.dumps(batched).encode())
    records = KafkaRecords("events", 0, list(range(len(values))), list(values), 0)
    request = SummaryRequest(top_k=10)
    written = [
        row
        for shard, rows in shard_inputs([records], stage, ShardLayout(3, 2)).items()
        for batch in update_shard(None, rows, stage, shard, BASE + 10_000).batches
        for row in writer_summary(batch, request, written_at=BASE + 10_000)
    ]
    assert sum(row["kind"] == "summary" for row in written) > 1  # several writers to merge
    metrics = EngineMetrics(port=0)
    metrics.record_batch(written)
    metrics.record_batch(written)  # a counter: the next batch adds to it
    expected = {"produce": 3 + 1 + 2, "fetch": 5 + 4, "remote_copy": 2, "leader_replication": 6}
    assert samples(metrics.scrape(), names.QUOTA_REQUESTS) == {
        f'{{quota="{quota}"}}': 2.0 * expected.get(quota, 0) for quota in names.QUOTAS
    }
