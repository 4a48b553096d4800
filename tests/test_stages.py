"""The streaming job's two stages, run without Spark: parity with the replay core."""

from __future__ import annotations

import itertools
import json
from collections.abc import Hashable

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotastream.redis_contract import decode_remote_log
from state.config import parse_quota_config
from state.core import QuotaCore
from state.events import EventBounds
from state.live_config import (
    LiveConfigs,
    SetClientQuota,
    SetEnforcement,
    encode_change,
)
from state.quota_types import QuotaType
from state.shard import ShardState
from streaming.engine import stages
from streaming.engine.shard_layout import ShardLayout
from streaming.engine.source_records import RECORDS_PER_CHUNK, KafkaRecords
from streaming.engine.stages import (
    DECISION,
    DECISION_SCHEMA,
    PACKED_SCHEMA,
    REJECT,
    REMOTE_LOG,
    STAGE_SCHEMA,
    TIMERS,
    StageSettings,
    staged_batches,
    unpacked,
    update_shard,
)
from tests.support.agents import FakeClock
from tests.support.expected import final_decisions
from tests.support.factories import BASE, MIXED_QUOTAS, mixed_payloads, produce, remote_segment
from tests.support.stage_runs import packs_by_shard, shard_inputs

CONFIG = parse_quota_config(MIXED_QUOTAS, "test config")
SETTINGS = StageSettings(CONFIG, EventBounds(), 65_536)
#: Four shards spread over two state tasks: their keys are not their numbers.
LAYOUT = ShardLayout(4, 2)
ONE_SHARD = ShardLayout(1, 1)
NOW = BASE + 3_600_000  # the batch time: after every event, so throttles are over


def payloads(seed: int, count: int, span_ms: int = 20_000) -> list[bytes]:
    out = mixed_payloads(seed, count, span_ms=span_ms)
    out.insert(count // 2, b"not json")
    return out


def kafka_records(
    values: list[bytes], first_offset: int = 0, config_version: int = 0
) -> KafkaRecords:
    offsets = list(range(first_offset, first_offset + len(values)))
    return KafkaRecords("events", 0, offsets, list(values), config_version)


def staged(
    values: list[bytes],
    stage: StageSettings,
    config_version: int = 0,
    layout: ShardLayout = ONE_SHARD,
) -> pd.DataFrame:
    reads = [kafka_records(values, config_version=config_version)]
    batches = list(staged_batches(reads, stage, layout))
    rows: pd.DataFrame = pa.Table.from_batches(batches).to_pandas()
    return rows


def batched(values: list[bytes], sizes: list[int]) -> list[bytes]:
    """``values`` packed into JSON array messages of the given sizes in turn (size 1: the
    event alone); payloads that are not JSON stay messages of their own."""
    messages: list[bytes] = []
    pending: list[bytes] = []
    turn = itertools.cycle(sizes or [1])
    size = next(turn)
    for value in values:
        if not value.startswith(b"{"):
            messages.append(value)
            continue
        pending.append(value)
        if len(pending) == size:
            messages.append(pending[0] if size == 1 else b"[" + b",".join(pending) + b"]")
            pending, size = [], next(turn)
    if pending:
        messages.append(b"[" + b",".join(pending) + b"]")
    return messages


def reads_of(values: list[bytes], reads: int) -> list[KafkaRecords]:
    """``values`` as up to ``reads`` consecutive reads of one partition."""
    size = max(1, -(-len(values) // reads))
    return [
        kafka_records(values[first : first + size], first) for first in range(0, len(values), size)
    ]


def run_stages(
    micro_batches: list[list[bytes]], reads: int = 1, staged_together: int = RECORDS_PER_CHUNK
) -> tuple[pd.DataFrame, dict[int, ShardState]]:
    """Both stages over successive micro-batches, as the query runs them per shard; the reads
    staged together in groups of ``staged_together`` records."""
    states: dict[int, ShardState] = {}
    latest: dict[tuple[str, str], dict[Hashable, object]] = {}
    rejects = []
    for values in micro_batches:
        inputs = shard_inputs(reads_of(values, reads), SETTINGS, LAYOUT, staged_together)
        for shard, rows in inputs.items():
            update = update_shard(states.get(shard), rows, SETTINGS, shard, NOW)
            if update.state is not None:  # the dead-letter group keeps none
                states[shard] = update.state
            for record in update.rows.to_dict(orient="records"):
                if record["row_type"] == DECISION:
                    latest[(record["quota"], record["entity"])] = record
                elif record["row_type"] == REJECT:
                    rejects.append(record)
    assert {r["reason"] for r in rejects} == {"invalid_json"}
    assert len(rejects) == 1
    return pd.DataFrame(latest.values()), states


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    cuts=st.lists(st.integers(1, 149), max_size=4),
    message_sizes=st.lists(st.integers(1, 40), max_size=4),
    reads=st.integers(1, 6),
    staged_together=st.sampled_from([1, 40, RECORDS_PER_CHUNK]),
)
def test_streaming_stages_reach_the_same_final_decisions_as_replay(
    seed: int, cuts: list[int], message_sizes: list[int], reads: int, staged_together: int
) -> None:
    """Whatever the micro-batch splits, the reads a batch is read in and how many of them are
    staged together, and whether events come one per message or batched."""
    values = payloads(seed, 150, span_ms=10_000)
    messages = batched(values, message_sizes)
    bounds = [0, *sorted({cut % len(messages) for cut in cuts}), len(messages)]
    micro_batches = [messages[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    streamed, _ = run_stages(micro_batches, reads, staged_together)
    expected = final_decisions(values, CONFIG)
    key = ["quota", "entity"]
    got = streamed.set_index(key).sort_index()
    want = expected.set_index(key).sort_index()
    assert list(got.index) == list(want.index)
    for column in ("rate", "throttle_ms", "exceeded", "window_ms"):
        assert got[column].tolist() == pytest.approx(want[column].tolist()), column


@pytest.mark.parametrize("small_packs", [False, True])
def test_a_shard_is_given_every_read_s_rows_of_it_in_order(
    small_packs: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also when a shard's rows exceed a pack and the packs a batch of them (a pack is one
    binary value in Spark: both are bounded)."""
    values = payloads(3, 200)
    reads = reads_of(values, 3)
    if small_packs:
        monkeypatch.setattr(stages, "PACK_BYTES", 2_000)
        monkeypatch.setattr(stages, "BATCH_OF_PACKS_BYTES", 20_000)
        batches = list(stages.packed_by_shard(staged_batches(reads[:1], SETTINGS, LAYOUT)))
        assert len(batches) > 1
        assert max(len(packs) for packs in packs_by_shard(reads[:1], SETTINGS, LAYOUT).values()) > 1
    staged_rows = pa.Table.from_batches(
        [batch for read in reads for batch in staged_batches([read], SETTINGS, LAYOUT)],
        STAGE_SCHEMA,
    ).to_pandas(integer_object_nulls=True)
    given = shard_inputs(reads, SETTINGS, LAYOUT, records=1)  # each read staged on its own
    assert sorted(given) == sorted(staged_rows["shard"].unique())
    assert -1 in given
    for shard, rows in given.items():
        expected = staged_rows[staged_rows["shard"] == shard].reset_index(drop=True)
        # Integer columns are objects only where the shard's own rows have nulls.
        pd.testing.assert_frame_equal(rows, expected, check_dtype=False, obj=f"shard {shard}")


def test_reads_are_staged_together_up_to_a_count_of_records_or_of_value_bytes() -> None:
    def read(*sizes: int | None) -> KafkaRecords:
        values = [None if size is None else b"x" * size for size in sizes]
        return KafkaRecords("t", 0, list(range(len(sizes))), values, 0)

    reads = [read(10, None, 30), read(50), read(5, 5), read(100), read(1)]
    assert [read.value_bytes for read in reads] == [40, 50, 10, 100, 1]
    by_bytes = stages.staged_together(reads, records=10, value_bytes=60)
    assert [[reads.index(r) for r in group] for group in by_bytes] == [[0, 1], [2, 3], [4]]
    by_records = stages.staged_together(reads, records=3, value_bytes=1000)
    assert [[reads.index(r) for r in group] for group in by_records] == [[0], [1, 2], [3, 4]]


def test_reads_staged_together_keep_each_reject_s_own_coordinates() -> None:
    """A task stages the reads of several partitions in one call: each rejected event still
    names its own topic, partition, offset and index in its batched message."""
    good = json.dumps(produce("alice", "app1", 10, BASE)).encode()
    reads = [
        KafkaRecords("a", 0, [10, 11], [good, b"not json"], 0),
        KafkaRecords("b", 3, [100, 101, 102], [b"[" + good + b',{"kind":"x"}]', good, None], 0),
    ]
    batches = list(staged_batches(reads, SETTINGS, LAYOUT))
    rows = pa.Table.from_batches(batches, STAGE_SCHEMA).to_pandas(integer_object_nulls=True)
    rejected = rows[rows["row_type"] == REJECT]
    assert rejected[["topic", "partition", "offset", "index"]].values.tolist() == [
        ["a", 0, 11, None],
        ["b", 3, 100, 1],
        ["b", 3, 102, None],
    ]
    assert rows.loc[rows["row_type"] == "usage", "requests"].sum() == 3
    with pytest.raises(ValueError, match="configuration versions"):
        list(staged_batches([*reads, KafkaRecords("a", 0, [12], [good], 1)], SETTINGS, LAYOUT))


def test_a_shards_output_has_every_kind_of_row_in_the_decision_schema() -> None:
    rows = staged(payloads(4, 200), SETTINGS, layout=LAYOUT)
    batches = [
        batch
        for _, group in rows.groupby("shard")
        for batch in update_shard(None, group, SETTINGS, int(group["shard"].iloc[0]), NOW).batches
    ]
    assert {batch.column("row_type")[0].as_py() for batch in batches} >= {DECISION, TIMERS, REJECT}
    for batch in batches:
        assert batch.schema == DECISION_SCHEMA


def test_the_shards_packed_output_unpacks_into_the_same_rows() -> None:
    """What Spark moves between the stateful stage and the sink: one value per shard."""
    rows = staged(payloads(4, 200), SETTINGS, layout=LAYOUT)
    updates = [
        update_shard(None, group, SETTINGS, int(group["shard"].iloc[0]), NOW)
        for _, group in rows.groupby("shard")
    ]
    packed = pd.concat([update.packed() for update in updates], ignore_index=True)
    assert len(packed) == len(updates)
    (out,) = unpacked(iter([pa.RecordBatch.from_pandas(packed, schema=PACKED_SCHEMA)]))
    expected = pa.Table.from_batches([b for u in updates for b in u.batches], DECISION_SCHEMA)
    assert pa.Table.from_batches([out]).equals(expected)
    assert list(unpacked(iter([pa.RecordBatch.from_pylist([], schema=PACKED_SCHEMA)]))) == []


def test_idle_entities_leave_the_state_and_late_events_for_them_are_rejected() -> None:
    clock = FakeClock(wall_ms=BASE)
    stage = StageSettings(
        CONFIG,
        EventBounds(),
        65_536,
        max_past_ms=60_000,
        max_future_ms=60_000,
        clock=clock,
    )

    def step(values: list[bytes], state: ShardState | None) -> tuple[ShardState, pd.DataFrame]:
        update = update_shard(state, staged(values, stage), stage, 0, stage.now_ms())
        assert update.state is not None
        return update.state, update.rows

    first = [json.dumps(produce(f"u{i}", "c", 1000, BASE)).encode() for i in range(4)]
    state, _ = step(first, None)
    assert len(QuotaCore.restore(CONFIG, state.tables).tables[QuotaType.PRODUCE]) == 4

    clock.advance_ms(2 * 3_600_000)  # two hours later only u0 is active
    later = BASE + 2 * 3600 * 1000
    state, out = step(
        [
            json.dumps(produce("u0", "c", 500, later)).encode(),
            json.dumps(produce("u1", "c", 500, BASE)).encode(),
        ],  # too old now: rejected
        state,
    )
    table = QuotaCore.restore(CONFIG, state.tables).tables[QuotaType.PRODUCE]
    assert list(table.keys) == ["user=u0,broker=1"]
    assert out.loc[out["row_type"] == REJECT, "reason"].tolist() == ["ts_out_of_bounds"]
    assert out.loc[out["row_type"] == DECISION, "rate"].tolist() == [pytest.approx(500 / 10.0)]


def one_shard_step(
    stage: StageSettings, values: list[bytes], state: ShardState | None, version: int = 0
) -> tuple[ShardState, pd.DataFrame]:
    update = update_shard(state, staged(values, stage, version), stage, 0, stage.now_ms())
    assert update.state is not None
    return update.state, update.rows


def test_remote_segment_events_keep_partition_sizes_once_per_segment() -> None:
    stage = StageSettings(CONFIG, EventBounds(), 65_536, clock=FakeClock(wall_ms=BASE))

    def segment(segment_id: str, size: int, state: str, epoch: int) -> bytes:
        event = remote_segment("orders", 3, segment_id, size, state, BASE - 1000, epoch)
        return json.dumps(event).encode()

    copies = [segment("a", 100, "copy_finished", 0), segment("b", 200, "copy_finished", 1)]
    state, out = one_shard_step(stage, copies, None)
    (row,) = out[out["row_type"] == REMOTE_LOG].to_dict(orient="records")
    assert (row["topic"], row["partition"]) == ("orders", 3)
    document = json.loads(row["remote_log"])
    assert (document["total"], document["epochs"]) == (300, {"0": 100, "1": 200})
    assert [s[0] for s in document["segments"]] == ["a", "b"]
    # Redelivered copies change nothing; a delete removes its segment (and its epoch).
    state, out = one_shard_step(stage, [*copies, segment("a", 100, "delete_finished", 0)], state)
    document = json.loads(out.loc[out["row_type"] == REMOTE_LOG, "remote_log"].iloc[0])
    assert (document["total"], document["epochs"]) == (200, {"1": 200})
    state, out = one_shard_step(stage, copies, state)
    assert (out["row_type"] == REMOTE_LOG).sum() == 0  # nothing changed: nothing to write
    # The last segment deleted: the partition's row says so (its Redis key goes).
    state, out = one_shard_step(stage, [segment("b", 200, "delete_finished", 1)], state)
    assert out.loc[out["row_type"] == REMOTE_LOG, "remote_log"].tolist() == [None]


def test_an_unclean_election_counts_diverged_segments_in_the_metric_but_not_in_retention() -> None:
    """KIP-852 through the engine's stages: broker 1 led epochs 0 and 1 and uploaded a, b
    (spanning both) and c; an unclean election gave epoch 2 to broker 2, whose log ended at 149,
    so c (offsets 130-199) is outside the new lineage. RemoteLogSizeBytes counts every listed
    segment; retention counts and walks only the lineage's, each once."""
    stage = StageSettings(CONFIG, EventBounds(), 65_536, clock=FakeClock(wall_ms=BASE))

    def segment(segment_id: str, size: int, epochs: dict[int, int], end: int) -> bytes:
        event = remote_segment("orders", 3, segment_id, size, "copy_finished", BASE - 1000)
        event |= {
            "leader_epoch": max(epochs),
            "segment_leader_epochs": {str(e): o for e, o in epochs.items()},
            "end_offset": end,
        }
        return json.dumps(event).encode()

    lineage = {
        "kind": "leader_epochs",
        "ts": BASE - 500,
        "broker": 2,
        "topic": "orders",
        "partition": 3,
        "epochs": {"0": 0, "1": 100, "2": 150},
        "log_end_offset": 400,
    }
    events = [
        segment("a", 100, {0: 0}, 99),
        segment("b", 100, {0: 90, 1: 100}, 129),
        segment("c", 100, {1: 130}, 199),
        segment("d", 100, {1: 120, 2: 150}, 179),
        segment("e", 300, {2: 180}, 299),
    ]
    _, out = one_shard_step(stage, [*events, json.dumps(lineage).encode()], None)
    remote_log = decode_remote_log(
        "-", out.loc[out["row_type"] == REMOTE_LOG, "remote_log"].iloc[0]
    )
    assert remote_log.total == 700  # RemoteLogSizeBytes: c too
    # remoteLogSize(epoch): a segment under each of its epochs.
    assert remote_log.epochs == {0: 200, 1: 300, 2: 400}
    assert remote_log.lineage == [(0, 0), (1, 100), (2, 150)]
    assert remote_log.retention_bytes == 600
    assert remote_log.retention_walk == [
        ("a", 100, True),
        ("b", 100, True),
        ("d", 100, True),
        ("c", 100, False),
        ("e", 300, True),
    ]
    # 600 remote + 50 local against 320: a, b, d go; c is passed over; e is kept.
    assert remote_log.retention_breach(retention_bytes=320, local_only_bytes=50) == ["a", "b", "d"]
    # Without the lineage every live segment counts, oldest copy first: c would be deleted.
    _, out = one_shard_step(stage, events, None)
    unreported = decode_remote_log(
        "-", out.loc[out["row_type"] == REMOTE_LOG, "remote_log"].iloc[0]
    )
    assert (unreported.retention_bytes, unreported.lineage) == (700, None)
    assert "c" in unreported.retention_breach(retention_bytes=320, local_only_bytes=50)


def test_a_batch_decides_with_the_configuration_version_it_pinned() -> None:
    base = parse_quota_config({"clients": [{"user": "alice", "producer_byte_rate": 1000}]}, "t")
    log = [
        encode_change(SetClientQuota(user="alice", values={"producer_byte_rate": 100.0})),
        encode_change(SetEnforcement(shadow={"produce": True})),
        encode_change(SetEnforcement(shadow={"produce": False})),
        encode_change(SetClientQuota(user="alice", values={"exempt": True})),
    ]
    reads: list[tuple[int, int]] = []

    def read(start: int, end: int) -> list[bytes]:
        reads.append((start, end))
        return log[start:end]

    stage = StageSettings(
        base,
        EventBounds(),
        65_536,
        clock=FakeClock(wall_ms=BASE),
        live_configs=LiveConfigs(base, read),
    )
    burst = [json.dumps(produce("alice", "app", 20_000, BASE - 500)).encode()]
    expected = [  # (version, limit, mode, a timer pending)
        (0, 1000.0, "enforced", True),
        (1, 100.0, "enforced", True),
        (2, 100.0, "shadow", False),
        (3, 100.0, "enforced", True),
        (4, None, "exempt", False),
    ]
    state = None
    for version, limit, mode, pending in expected:
        state, out = one_shard_step(stage, burst, state, version)
        decision = out[out["row_type"] == DECISION].iloc[0]
        assert decision["config_version"] == version
        assert decision["mode"] == mode
        assert (None if pd.isna(decision["limit"]) else decision["limit"]) == limit
        timers = out[out["row_type"] == TIMERS].iloc[0]
        assert timers["timers_pending"] == int(pending)
    # Each version's records were read once, moving forward from the previous version.
    assert reads == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_packs_are_compressed_and_read_back_whole() -> None:
    """A usage row leaves most of STAGE_SCHEMA null, and every pack's byte crosses into the JVM,
    its shuffle and back: packs are LZ4-compressed Arrow streams."""
    staged_rows = staged_batches(reads_of(payloads(3, 2_000), 1), SETTINGS, LAYOUT)
    table = pa.Table.from_batches(list(staged_rows))
    (packs,) = stages.arrow_streams([table])
    uncompressed = pa.BufferOutputStream()
    with pa.ipc.new_stream(uncompressed, table.schema) as writer:
        writer.write_table(table)
    assert len(packs) == 1
    assert packs.nbytes < uncompressed.tell() / 2
    assert pa.Table.from_batches(stages.stream_batches(packs[0].as_buffer())).equals(table)


def test_an_entity_s_shard_is_pinned_whether_or_not_its_keys_are_distinct() -> None:
    """A restarted query finds an entity's state in the shard it was kept in: the hash must not
    change between processes, runs or pandas versions (these shards were the first ones)."""
    keys = [
        "user=alice,client-id=app1",
        "client-id=app%2C2",
        "broker=1",
        "user=bob",
        "cluster",
        "topic=t,partition=0",
    ]
    pinned = [6, 7, 4, 5, 2, 7]
    numbered = ShardLayout.numbered(8)
    assert stages.shard_of(pd.Series(keys * 2), numbered).tolist() == pinned * 2
    assert stages.shard_of(np.array(keys, dtype=object), numbered, distinct=True).tolist() == pinned
    # A layout gives the same shards their keys.
    spread = ShardLayout(8, 2)
    assert stages.shard_of(pd.Series(keys), spread).tolist() == [spread.keys[s] for s in pinned]
