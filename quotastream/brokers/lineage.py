"""Each tiered partition's leader-epoch lineage, as its leader has it, published as
``leader_epochs`` events: size-based retention counts and walks the remote segments by it
(KIP-852, ``state/leader_epochs.py``), and only the leader's own cache has it.

No Kafka API returns a leader-epoch cache, but OffsetForLeaderEpoch answers one entry of it per
question, as the leader's ``LeaderEpochFileCache.endOffsetFor`` does: asked for epoch ``q``, the
largest epoch ``f <= q`` it holds and the offset where the epoch after ``f`` starts (its log end
offset when ``f`` is its latest). So :func:`walk` asks for the current epoch, then for one below
each epoch answered, and every answer gives the start of the epoch above it
(:func:`lineage_of`). The walk ends where the cache does: no epoch answered, or one that ends at
or before the log start offset (an epoch below the cache's first is answered as if it were one,
holding no records). The lowest epoch starts at the log start offset: that is where the cache
puts its first entry when the log start moves (``truncateFromStart``).

Each question names the leader epoch the walk began under, so a leader that moves mid-walk
refuses the rest (``FENCED_LEADER_EPOCH``, ``NOT_LEADER_OR_FOLLOWER``): never a lineage pieced
together from two caches. Such a partition is left out of this pass and walked again at the next.
A pass asks each leader once per epoch of its longest lineage, all its partitions in one request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Final, NamedTuple

from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.net.compat import KafkaNetClient
from kafka.protocol.consumer.offsets import OffsetForLeaderEpochRequest, OffsetSpec
from kafka.structs import TopicPartition
from prometheus_client import CollectorRegistry, Counter

from quotastream.clock import SYSTEM_CLOCK, Clock
from quotastream.outage import Outage
from quotastream.publisher import publish_every
from state.event_contract import LeaderEpochs
from state.leader_epochs import Epochs

REMOTE_STORAGE: Final = "remote.storage.enable"
_ASKED: Final = OffsetForLeaderEpochRequest.OffsetForLeaderTopic


class Answer(NamedTuple):
    """The leader's answer to "where does epoch q end": the largest epoch ``<= q`` it holds
    (-1: none) and the offset the epoch after it starts at (the log end offset for the latest)."""

    epoch: int
    end_offset: int


#: ``ask(leader, {partition: (leader epoch walked under, epoch asked)})``: each partition's
#: answer, or None where the leader refused (it moved, or no longer has the partition).
Questions = Mapping[TopicPartition, tuple[int, int]]
Ask = Callable[[int, Questions], Mapping[TopicPartition, Answer | None]]


def walk(
    ask: Ask,
    leader: int,
    current: Mapping[TopicPartition, int],
    log_starts: Mapping[TopicPartition, int],
) -> dict[TopicPartition, list[Answer]]:
    """The answers down each partition's cache, latest epoch first, asking ``leader`` for all
    of ``current`` (partition -> its leader epoch) at once; a partition refused is left out."""
    answers: dict[TopicPartition, list[Answer]] = {partition: [] for partition in current}
    asking = dict(current)
    while asking:
        answered = ask(leader, {p: (current[p], epoch) for p, epoch in asking.items()})
        below: dict[TopicPartition, int] = {}
        for partition in asking:
            answer = answered.get(partition)
            if answer is None:
                del answers[partition]
                continue
            walked = answers[partition]
            if answer.epoch < 0 or (walked and answer.end_offset <= log_starts[partition]):
                continue
            walked.append(answer)
            if answer.epoch > 0:
                below[partition] = answer.epoch - 1
        asking = below
    return {partition: walked for partition, walked in answers.items() if walked}


def lineage_of(answers: Sequence[Answer], log_start_offset: int) -> tuple[Epochs, int]:
    """The lineage (epoch -> first offset, ascending) and log end offset the answers of one
    partition's :func:`walk` make."""
    if not answers:
        raise ValueError("a lineage needs at least the latest epoch's answer")
    starts = [below.end_offset for below in answers[1:]]
    starts.append(min(log_start_offset, answers[-1].end_offset))
    epochs = tuple(
        sorted((answer.epoch, start) for answer, start in zip(answers, starts, strict=True))
    )
    return epochs, answers[0].end_offset


def report_of(
    leader: int,
    partition: TopicPartition,
    answers: Sequence[Answer],
    log_start_offset: int,
    ts: int,
) -> LeaderEpochs:
    """The ``leader_epochs`` event of one partition's :func:`walk` on ``leader``."""
    epochs, log_end_offset = lineage_of(answers, log_start_offset)
    return LeaderEpochs(
        ts=ts,
        bytes=0,
        count=1,
        broker=leader,
        topic=partition.topic,
        partition=partition.partition,
        epochs=dict(epochs),
        log_end_offset=log_end_offset,
    )


class LineageMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.published = Counter(
            "quotastream_leader_epochs_reports_published",
            "Partition lineages published to the events topic",
            registry=registry,
        )
        self.refused = Counter(
            "quotastream_leader_epochs_walks_refused",
            "Partitions left out of a pass: the leader refused mid-walk (it moved) or holds no "
            "epoch yet; walked again the next pass",
            registry=registry,
        )


class LineageSource:
    """Every pass (:meth:`poll`), the lineage of every partition of every topic with
    ``remote.storage.enable``, from its leader; :meth:`run` publishes one every interval.

    ``publish(events)`` sends events to the events topic and returns once the brokers have them
    (raising on failure). A pass that fails publishes nothing: a lineage is a state, the next
    pass reports it anew."""

    def __init__(
        self,
        admin: KafkaAdminClient,
        client: KafkaNetClient,
        *,
        publish: Callable[[Sequence[LeaderEpochs]], None],
        metrics: LineageMetrics,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._admin = admin
        self._client = client
        self._publish = publish
        self._metrics = metrics
        self._clock = clock

    def poll(self) -> list[LeaderEpochs]:
        """The lineage of every tiered partition whose leader answered the whole walk."""
        leaders = self._tiered_leaders()
        if not leaders:
            return []
        log_starts = {
            partition: found.offset
            for partition, found in self._admin.list_partition_offsets(
                dict.fromkeys(leaders, OffsetSpec.EARLIEST)
            ).items()
        }
        self._client.check_version()  # bootstraps the client's view of the brokers, once
        by_leader: dict[int, dict[TopicPartition, int]] = {}
        for partition, (leader, epoch) in leaders.items():
            by_leader.setdefault(leader, {})[partition] = epoch
        reports = []
        ts = self._clock.wall_ms()
        for leader, current in sorted(by_leader.items()):
            walked = walk(self._ask, leader, current, log_starts)
            self._metrics.refused.inc(len(current) - len(walked))
            for partition, answers in sorted(walked.items()):
                reports.append(report_of(leader, partition, answers, log_starts[partition], ts))
        return reports

    def _tiered_leaders(self) -> dict[TopicPartition, tuple[int, int]]:
        """Each partition of a tiered topic -> (its leader, its leader epoch); leaderless ones
        are left out."""
        topics = self._admin.describe_topics()
        names = [topic["name"] for topic in topics if not topic.get("is_internal")]
        if not names:
            return {}
        described = self._admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
        ).get("topic", {})
        tiered = {
            name
            for name in names
            if str(described.get(name, {}).get(REMOTE_STORAGE, {}).get("value")) == "true"
        }
        return {
            TopicPartition(topic["name"], int(p["partition_index"])): (
                int(p["leader_id"]),
                int(p["leader_epoch"]),
            )
            for topic in topics
            if topic["name"] in tiered
            for p in topic["partitions"]
            if int(p["leader_id"]) >= 0
        }

    def _ask(self, leader: int, questions: Questions) -> dict[TopicPartition, Answer | None]:
        by_topic: dict[
            str, list[OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition]
        ] = {}
        for partition, (current, epoch) in questions.items():
            by_topic.setdefault(partition.topic, []).append(
                _ASKED.OffsetForLeaderPartition(
                    partition=partition.partition, current_leader_epoch=current, leader_epoch=epoch
                )
            )
        request = OffsetForLeaderEpochRequest(
            replica_id=-1,
            topics=[_ASKED(topic=topic, partitions=asked) for topic, asked in by_topic.items()],
        )
        response = self._client.send_and_receive(leader, request)
        answered: dict[TopicPartition, Answer | None] = {}
        for result in response.topics:
            for each in result.partitions:
                refused = each.error_code != 0
                answered[TopicPartition(result.topic, each.partition)] = (
                    None if refused else Answer(each.leader_epoch, each.end_offset)
                )
        return answered

    def publish(self, reports: Sequence[LeaderEpochs]) -> None:
        if reports:
            self._publish(reports)
            self._metrics.published.inc(len(reports))

    def run(self, stopped: threading.Event, interval_s: float, outage: Outage) -> None:
        """A pass every ``interval_s`` until ``stopped`` (:func:`publish_every`); then its
        clients are closed (the source owns them)."""
        try:
            publish_every(self, stopped, interval_s, outage)
        finally:
            self.close()

    def close(self) -> None:
        """Closes its clients: an unclosed one keeps its connection thread, which goes on
        reconnecting to a cluster that has gone."""
        self._admin.close()
        self._client.close()
