"""Remote segments within a partition's leader-epoch lineage: Kafka's own RemoteLogManagerTest
cases, and the retention walk."""

from __future__ import annotations

import pytest

from state.leader_epochs import (
    RemoteSegment,
    breach,
    epochs_of,
    filtered,
    retention,
    within_lineage,
)

# RemoteLogManagerTest.testRemoteSegmentWithinLeaderEpochs
LOG_END = 90
LINEAGE = epochs_of({0: 0, 1: 10, 2: 20, 3: 30, 4: 40, 5: 50, 7: 70})


def test_filtered_leaves_out_epochs_without_records() -> None:
    """RemoteLogManagerTest.testBuildFilteredLeaderEpochMap."""
    epochs = epochs_of({0: 0, 1: 0, 2: 0, 3: 30, 4: 40, 5: 60, 6: 60, 7: 70, 8: 70})
    assert filtered(epochs) == epochs_of({2: 0, 3: 30, 4: 40, 6: 60, 8: 70})


@pytest.mark.parametrize(
    ("segment", "start", "end", "within"),
    [
        ({1: 15, 2: 20, 3: 30}, 15, 35, True),  # several epochs within the lineage
        ({1: 15}, 15, 19, True),  # one epoch
        ({0: 0}, 0, 5, True),  # starts at its epoch's start offset
        ({7: 70}, 70, 75, True),
        ({1: 15, 2: 20}, 15, 29, True),  # ends at the end of epoch 2
        ({5: 55, 6: 60, 7: 70}, 55, 85, False),  # epoch 6 is not in the lineage
        ({1: 15, 2: 20, 4: 40}, 15, 45, False),  # epoch 3 of the lineage is missing
        (dict(LINEAGE), 15, 95, False),  # ends past the log end offset
        (dict(LINEAGE), 15, 90, False),  # ends at the log end offset
        ({1: 5, 2: 20}, 5, 25, False),  # starts before epoch 1 started
        ({1: 15, 2: 20}, 15, 35, False),  # ends after epoch 2 ended
    ],
)
def test_segments_within_the_lineage(
    segment: dict[int, int], start: int, end: int, within: bool
) -> None:
    assert within_lineage(epochs_of(segment), end, LOG_END, LINEAGE) is within


@pytest.mark.parametrize(
    ("segment", "end", "within"),
    [
        ({5: 14, 7: 15, 9: 100}, 150, True),
        ({2: 5, 3: 6}, 7, False),
        ({7: 15, 9: 100, 10: 200}, 250, False),
        ({8: 75}, 100, False),
        ({7: 15, 9: 101}, 150, False),
        ({9: 99}, 150, False),
    ],
)
def test_overlapping_segments_after_the_log_start_moved(
    segment: dict[int, int], end: int, within: bool
) -> None:
    """RemoteLogManagerTest.testRemoteSegmentWithinLeaderEpochsForOverlappingSegments."""
    lineage = epochs_of({7: 51, 9: 100})
    assert within_lineage(epochs_of(segment), end, 210, lineage) is within


def test_an_unknown_end_offset_checks_the_epochs_only() -> None:
    assert within_lineage(epochs_of({1: 15, 2: 20}), -1, LOG_END, LINEAGE)
    assert not within_lineage(epochs_of({6: 60}), -1, LOG_END, LINEAGE)


def unclean_election() -> tuple[list[RemoteSegment], tuple[tuple[int, int], ...], int]:
    """Broker 1 led epochs 0 and 1 and uploaded a, b (spanning 0-1) and c; an unclean election
    gave epoch 2 to broker 2, whose log ended at 149 (c's offsets 150-199 are not in it): the
    lineage is now 0:0, 1:100, 2:150. Broker 2 uploaded d (epochs 1-2) and e (epoch 2)."""
    segments = [
        RemoteSegment("a", 100, epochs_of({0: 0}), 99),
        RemoteSegment("b", 100, epochs_of({0: 90, 1: 100}), 129),
        RemoteSegment("c", 100, epochs_of({1: 130}), 199),  # diverged: past epoch 1's end
        RemoteSegment("d", 100, epochs_of({1: 120, 2: 150}), 179),
        RemoteSegment("e", 300, epochs_of({2: 180}), 299),
    ]
    return segments, epochs_of({0: 0, 1: 100, 2: 150}), 400


def test_retention_counts_each_segment_within_the_lineage_once() -> None:
    segments, lineage, log_end = unclean_election()
    sized = retention(segments, lineage, log_end)
    assert [(s.segment_id, within) for s, within in sized.order] == [
        ("a", True),
        ("b", True),  # listed under epochs 0 and 1: walked once
        ("d", True),  # under epoch 1 by its first offset there: 120 before c's 130
        ("c", False),
        ("e", True),
    ]
    assert sized.size == 600  # c's 100 bytes are in remote storage, not in the lineage


def test_breach_passes_over_segments_outside_the_lineage_and_stops_at_the_first_kept() -> None:
    segments, lineage, log_end = unclean_election()
    sized = retention(segments, lineage, log_end)
    walk = [(s.segment_id, s.size, within) for s, within in sized.order]
    # 600 remote + 50 local, retention 320: 330 to free. a, b, d fit, c is passed over, e kept.
    assert breach(walk, sized.size, 50, 320) == ["a", "b", "d"]
    # 650 - 500 = 150 to free: a fits, b would leave 50 - 100 < 0: the walk stops at b.
    assert breach(walk, sized.size, 50, 500) == ["a"]
    assert breach(walk, sized.size, 50, 650) == []
    assert breach(walk, sized.size, 50, -1) == []


def test_breach_refuses_negative_sizes() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        breach([("a", -1, True)], 1, 0, 0)
