"""Walking a leader's epoch cache with OffsetForLeaderEpoch (quotastream/brokers/lineage.py),
against a transcription of Kafka's ``LeaderEpochFileCache``: what the walk makes is the cache,
as size-based retention reads it (``buildFilteredLeaderEpochMap``)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.structs import TopicPartition

from quotastream.brokers.lineage import Answer, Ask, Questions, lineage_of, walk
from state.leader_epochs import Epochs, filtered

UNDEFINED = Answer(-1, -1)


def truncated_from_start(cache: Epochs, log_start: int) -> Epochs:
    """``LeaderEpochFileCache.truncateFromStart``: entries starting at or before the new log
    start go, the last of them kept, moved to start there."""
    gone = [entry for entry in cache if entry[1] <= log_start]
    kept = [entry for entry in cache if entry[1] > log_start]
    return (((gone[-1][0], log_start),) if gone else ()) + tuple(kept)


def end_offset_for(cache: Epochs, requested: int, log_end_offset: int) -> Answer:
    """``LeaderEpochFileCache.endOffsetFor``: the largest epoch <= the one requested and where
    the next starts; the log end offset for the latest; the request itself when it is below
    every epoch (where the first starts)."""
    if requested < 0 or not cache:
        return UNDEFINED
    if cache[-1][0] == requested:
        return Answer(requested, log_end_offset)
    higher = next((entry for entry in cache if entry[0] > requested), None)
    if higher is None:
        return UNDEFINED
    floor = [entry for entry in cache if entry[0] <= requested]
    return Answer(floor[-1][0] if floor else requested, higher[1])


def leader_of(cache: Epochs, log_end_offset: int) -> Ask:
    def ask(leader: int, questions: Questions) -> dict[TopicPartition, Answer | None]:
        return {
            partition: end_offset_for(cache, epoch, log_end_offset)
            for partition, (_, epoch) in questions.items()
        }

    return ask


PARTITION = TopicPartition("orders", 0)


@st.composite
def caches(draw: st.DrawFn) -> tuple[Epochs, int, int]:
    """A cache as a leader holds it: epochs ascending, start offsets not decreasing, truncated
    to a log start offset; and its log end offset."""
    epochs = sorted(draw(st.sets(st.integers(0, 40), min_size=1, max_size=8)))
    starts = sorted(draw(st.lists(st.integers(0, 500), min_size=len(epochs), max_size=len(epochs))))
    log_end_offset = draw(st.integers(starts[-1], 600))
    log_start = draw(st.integers(starts[0], log_end_offset))
    cache = truncated_from_start(tuple(zip(epochs, starts, strict=True)), log_start)
    return cache, log_start, log_end_offset


@given(caches())
def test_the_walk_makes_the_lineage_retention_reads_from_the_cache(
    drawn: tuple[Epochs, int, int],
) -> None:
    cache, log_start, log_end_offset = drawn
    ask = leader_of(cache, log_end_offset)
    answers = walk(ask, 1, {PARTITION: cache[-1][0]}, {PARTITION: log_start})
    lineage, walked_end = lineage_of(answers[PARTITION], log_start)
    assert walked_end == log_end_offset
    assert filtered(lineage) == filtered(cache)


def test_a_walk_asks_one_below_each_epoch_answered_and_stops_at_the_log_start() -> None:
    """Epochs 3 (from 150, the log start), 4 (holding nothing) and 7 (from 200): asked 7, 6,
    then 3 (answered for 4's question); 2 is answered as if it were an epoch ending at the log
    start, and ends the walk."""
    cache: Epochs = ((3, 150), (4, 200), (7, 200))
    asked: list[int] = []
    ask = leader_of(cache, 260)

    def recording(leader: int, questions: Questions) -> Mapping[TopicPartition, Answer | None]:
        asked.extend(epoch for _, epoch in questions.values())
        return ask(leader, questions)

    answers = walk(recording, 2, {PARTITION: 7}, {PARTITION: 150})
    assert asked == [7, 6, 3, 2]
    assert answers[PARTITION] == [Answer(7, 260), Answer(4, 200), Answer(3, 200)]
    assert lineage_of(answers[PARTITION], 150) == (((3, 150), (4, 200), (7, 200)), 260)


def test_a_partition_its_leader_refuses_mid_walk_is_left_out_and_the_others_finish() -> None:
    moved = TopicPartition("orders", 1)
    cache: Epochs = ((0, 0), (1, 40))
    ask = leader_of(cache, 90)
    rounds = 0

    def refusing_later(leader: int, questions: Questions) -> dict[TopicPartition, Answer | None]:
        nonlocal rounds
        rounds += 1
        answered = dict(ask(leader, questions))
        if rounds > 1:
            answered[moved] = None
        return answered

    answers = walk(
        refusing_later,
        1,
        {PARTITION: 1, moved: 1},
        {PARTITION: 0, moved: 0},
    )
    assert list(answers) == [PARTITION]
    assert lineage_of(answers[PARTITION], 0) == (((0, 0), (1, 40)), 90)


def test_no_answer_makes_no_lineage() -> None:
    with pytest.raises(ValueError, match="latest epoch"):
        lineage_of([], 0)
