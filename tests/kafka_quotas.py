"""A real Kafka broker's client quotas from Python: the admin calls kafka-python lacks, and a client
that records, for each Produce and Fetch, what the broker counted and what it decided.

kafka-python 3 has the AlterClientQuotas and DescribeClientQuotas protocol classes but no admin
method for them, so :func:`alter_client_quotas` and :func:`describe_client_quotas` send them over
its ``KafkaNetClient``. Quotas reach the broker's quota managers asynchronously (the controller
commits them, then the broker's metadata publisher applies them), so
:func:`await_client_quotas` waits until the broker describes exactly the quotas set.

:class:`QuotaClient` is one client (user, client-id) on one connection, driven in the caller's
thread (no I/O thread: the time stamped around a request is the time it was written and its
response read, nothing else runs in between). It sends hand-built requests, one at a time:

* Produce v9 (acks=1) of one record batch. The broker's produce quota records the request's size
  as its frame length: header and body, without the 4-byte length prefix
  (``RequestChannel.Request.sizeInBytes``), which is what kafka-python encoded and wrote.
* Fetch v12 without a session (``SessionlessFetchContext``) of one partition with
  ``partition_max_bytes=1``: the broker returns exactly one whole record batch (the first batch
  of a fetch is returned whole whatever the limit). The fetch quota records
  ``FetchResponse.sizeOf``: 4 + the body's size, i.e. the frame length less one byte on v12,
  whose response header is five bytes (correlation id and an empty tagged-field section). A fetch
  over its quota is answered empty and its size un-recorded; what it would have been is the size
  of the response that serves the same offset later.

Each :class:`Exchange` says when the broker can have recorded the request: not before it was sent
and not after its response was read; for Produce not before the batch's LogAppendTime either
(the topic is created with ``message.timestamp.type=LogAppendTime``: the broker stamps the batch
when it appends it, and records the quota right after, in the same thread, for acks=1). Both
clocks are the machine's wall clock (Java's ``currentTimeMillis``, Python's ``time_ns``), in
whole milliseconds as the broker uses them.

The client holds back while throttled, as kafka-python's own clients and Java's (KIP-219) do: the
broker mutes the connection for the throttle time anyway, and a request written into a muted
connection would be recorded whenever the broker reads it, long after it was sent.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import kafka.errors
from kafka.net.compat import KafkaNetClient
from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    CreateTopicsRequest,
    DescribeClientQuotasRequest,
)
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

#: A default entity's name, as conf/quotas.yaml and kafka-configs.sh write it.
DEFAULT: Final = "<default>"
#: DescribeClientQuotas component match types: the default entity, any named one.
_MATCH_DEFAULT, _MATCH_SPECIFIED = 1, 2
#: The broker's fetch quota counts this many header bytes in a Fetch response (v12: five are
#: sent): ``FetchResponse.sizeOf`` adds 4 to the body.
FETCH_COUNTED_HEADER: Final = 4
_REQUEST_TIMEOUT_MS: Final = 10_000


class ClientQuotaError(RuntimeError):
    """The broker refused a client quota request; the message names the entity and the error."""


@dataclass(frozen=True, order=True)
class QuotaEntity:
    """A client quota entity: ``user`` and ``client_id`` are each a name, :data:`DEFAULT`, or
    ``None`` when the entity does not name that part."""

    user: str | None = None
    client_id: str | None = None

    def __str__(self) -> str:
        parts = [f"{kind}={name}" for kind, name in self._parts()]
        return ",".join(parts)

    def _parts(self) -> list[tuple[str, str]]:
        return [
            (kind, name)
            for kind, name in (("user", self.user), ("client-id", self.client_id))
            if name is not None
        ]

    def wire(self) -> list[tuple[str, str | None]]:
        """(entity_type, entity_name) pairs as the protocol has them: a default is a null name."""
        return [(kind, None if name == DEFAULT else name) for kind, name in self._parts()]

    @staticmethod
    def from_wire(parts: list[tuple[str, str | None]]) -> QuotaEntity:
        names = {kind: DEFAULT if name is None else name for kind, name in parts}
        unknown = set(names) - {"user", "client-id"}
        if unknown:
            raise ClientQuotaError(f"unexpected client quota entity types {sorted(unknown)}")
        return QuotaEntity(names.get("user"), names.get("client-id"))


#: Quotas by entity: config key (``producer_byte_rate``, ``consumer_byte_rate``) -> value.
Quotas = Mapping[QuotaEntity, Mapping[str, float]]


def connect(address: str, user: str, password: str, client_id: str) -> KafkaNetClient:
    """A kafka-python client authenticated as ``user`` (SASL/SCRAM-SHA-512 on plaintext)."""
    client = KafkaNetClient(
        bootstrap_servers=address,
        client_id=client_id,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username=user,
        sasl_plain_password=password,
        request_timeout_ms=_REQUEST_TIMEOUT_MS,
    )
    client.check_version()
    return client


def node_of(client: KafkaNetClient) -> int:
    """The one broker's node id."""
    [broker] = client.cluster.brokers()
    node: int = broker.node_id
    return node


def create_topic(client: KafkaNetClient, name: str, configs: Mapping[str, str]) -> None:
    topic = CreateTopicsRequest.CreatableTopic
    config = topic.CreatableTopicConfig
    request = CreateTopicsRequest(
        topics=[
            topic(
                name=name,
                num_partitions=1,
                replication_factor=1,
                assignments=[],
                configs=[config(name=key, value=value) for key, value in configs.items()],
            )
        ],
        timeout_ms=_REQUEST_TIMEOUT_MS,
    )
    response = client.send_and_receive(node_of(client), request)
    for result in response.topics:
        if result.error_code:
            raise kafka.errors.for_code(result.error_code)(f"{result.name}: {result.error_message}")
    await_partition(client, name)


def await_partition(client: KafkaNetClient, topic: str, timeout_s: float = 15.0) -> None:
    """Returns once the broker serves partition 0 of ``topic``: CreateTopics answers when the
    controller has committed it, the broker creates the partition when its metadata catches up
    (until then a produce is refused). ListOffsets reaches the partition itself."""
    wanted = ListOffsetsRequest.ListOffsetsTopic
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=[
            wanted(
                name=topic,
                partitions=[
                    wanted.ListOffsetsPartition(
                        partition_index=0, current_leader_epoch=-1, timestamp=-1
                    )
                ],
            )
        ],
    )
    deadline = time.monotonic() + timeout_s
    while True:
        response = client.send_and_receive(node_of(client), request)
        errors = [
            partition.error_code
            for result in response.topics
            for partition in result.partitions
            if partition.error_code
        ]
        if not errors:
            return
        if time.monotonic() > deadline:
            error = kafka.errors.for_code(errors[0]).__name__
            raise kafka.errors.KafkaTimeoutError(f"{topic} not served {timeout_s} s on: {error}")
        client.poll(timeout_ms=20)


def alter_client_quotas(client: KafkaNetClient, quotas: Quotas, node: int | None = None) -> None:
    """Sets ``quotas`` (AlterClientQuotas, through ``node``: the one broker by default); raises
    :class:`ClientQuotaError` naming each entity the broker refused and its error."""
    entry = AlterClientQuotasRequest.EntryData
    request = AlterClientQuotasRequest(
        entries=[
            entry(
                entity=[
                    entry.EntityData(entity_type=kind, entity_name=name)
                    for kind, name in entity.wire()
                ],
                ops=[
                    entry.OpData(key=key, value=float(value), remove=False)
                    for key, value in values.items()
                ],
            )
            for entity, values in quotas.items()
        ],
        validate_only=False,
    )
    response = client.send_and_receive(node_of(client) if node is None else node, request)
    refused = [
        f"{QuotaEntity.from_wire(_parts(result.entity))}: "
        f"{kafka.errors.for_code(result.error_code).__name__} ({result.error_message})"
        for result in response.entries
        if result.error_code
    ]
    if refused:
        raise ClientQuotaError(f"AlterClientQuotas refused {'; '.join(refused)}")


def describe_client_quotas(
    client: KafkaNetClient, node: int | None = None
) -> dict[QuotaEntity, dict[str, float]]:
    """Every user and client-id quota the broker (``node``: the one by default) has
    (DescribeClientQuotas: each entity that names a user or a client-id, by name or as the
    default)."""
    node = node_of(client) if node is None else node
    described: dict[QuotaEntity, dict[str, float]] = {}
    component = DescribeClientQuotasRequest.ComponentData
    # A filter of one component matches the entities that have that part (strict=False: and any
    # other part); the two defaults need their own match type.
    for kind in ("user", "client-id"):
        for match_type in (_MATCH_DEFAULT, _MATCH_SPECIFIED):
            components = [component(entity_type=kind, match_type=match_type, match=None)]
            request = DescribeClientQuotasRequest(components=components, strict=False)
            response = client.send_and_receive(node, request)
            if response.error_code:
                error = kafka.errors.for_code(response.error_code).__name__
                raise ClientQuotaError(
                    f"DescribeClientQuotas of {kind} entities failed: {error} "
                    f"({response.error_message})"
                )
            for entry in response.entries or []:
                entity = QuotaEntity.from_wire(_parts(entry.entity))
                described[entity] = {value.key: value.value for value in entry.values}
    return described


def await_client_quotas(
    client: KafkaNetClient, quotas: Quotas, timeout_s: float = 15.0, node: int | None = None
) -> None:
    """Returns once the broker (``node``: the one by default) describes exactly ``quotas``:
    AlterClientQuotas answers when the controller has committed them; each broker applies them
    when its metadata catches up."""
    expected = {entity: dict(values) for entity, values in quotas.items()}
    deadline = time.monotonic() + timeout_s
    while (described := describe_client_quotas(client, node)) != expected:
        if time.monotonic() > deadline:
            raise ClientQuotaError(
                f"the broker describes {described} {timeout_s} s after setting {expected}"
            )
        client.poll(timeout_ms=20)


def _parts(entity: Any) -> list[tuple[str, str | None]]:
    return [(part.entity_type, part.entity_name) for part in entity]


def record_batch(value_bytes: int) -> bytes:
    """One uncompressed record batch of one record with a ``value_bytes``-byte value."""
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=value_bytes + 1024)
    builder.append(timestamp=None, key=None, value=b"q" * value_bytes)
    builder.close()
    batch: bytes = builder.buffer()
    return batch


def produce_request(topic: str, value_bytes: int) -> Any:
    """A Produce (``acks=1``, up to v9) of one record of ``value_bytes`` to partition 0."""
    data = ProduceRequest.TopicProduceData
    return ProduceRequest(
        transactional_id=None,
        acks=1,
        timeout_ms=_REQUEST_TIMEOUT_MS,
        topic_data=[
            data(
                name=topic,
                partition_data=[
                    data.PartitionProduceData(index=0, records=record_batch(value_bytes))
                ],
            )
        ],
        max_version=9,
    )


def fetch_request(topic: str, offset: int, partition_max_bytes: int, max_bytes: int) -> Any:
    """A Fetch v12 of partition 0 from ``offset`` without a fetch session (each fetch names its
    partition in full), not waiting for data."""
    wanted = FetchRequest.FetchTopic
    return FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            wanted(
                topic=topic,
                partitions=[
                    wanted.FetchPartition(
                        partition=0,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=partition_max_bytes,
                    )
                ],
            )
        ],
        forgotten_topics_data=[],
        rack_id="",
        max_version=12,
    )


@dataclass(frozen=True)
class Exchange:
    """One request and its response, as the client saw them (times: wall clock, epoch ms)."""

    kind: str  # "produce" or "fetch"
    user: str
    client_id: str
    sent_ms: int  # just before the request was written
    received_ms: int  # just after its response was read
    #: The earliest the broker can have recorded it: ``sent_ms``, or for Produce the batch's
    #: LogAppendTime (the broker records the quota after appending, with its clock read again).
    earliest_ms: int
    #: Produce: the request size the broker records. Fetch: 4 + this response's body, what the
    #: broker records for a served fetch (for a throttled one it recorded what it would have sent).
    counted_bytes: int
    throttle_ms: int
    #: Produce: the batch's base offset; Fetch: the offset fetched from.
    offset: int
    #: Fetch: whether records came back (a throttled fetch is answered empty).
    served: bool


class QuotaClient:
    """One client (user, client-id) on its own connection, one request at a time."""

    def __init__(self, address: str, user: str, password: str, client_id: str) -> None:
        self.user, self.client_id = user, client_id
        self._client = connect(address, user, password, client_id)
        self._node = node_of(self._client)
        # The broker connection (and its SCRAM exchange) now, not at the first request.
        self._client.await_ready(self._node, timeout_ms=_REQUEST_TIMEOUT_MS)

    def close(self) -> None:
        self._client.close()

    def wait_until(self, wall_ms: float) -> None:
        """Idles until ``wall_ms``, serving the connection's timers meanwhile."""
        while (left := wall_ms - time.time_ns() / 1e6) > 0:
            self._client.poll(timeout_ms=left)

    def produce(self, topic: str, value_bytes: int) -> Exchange:
        request = produce_request(topic, value_bytes)
        sent, response, received = self._exchange(request)
        [topic_response] = response.responses
        [partition] = topic_response.partition_responses
        if partition.error_code:
            raise kafka.errors.for_code(partition.error_code)(f"produce to {topic}")
        # -1 unless the topic stamps LogAppendTime.
        appended = int(partition.log_append_time_ms)
        if appended != -1 and not sent <= appended <= received:
            raise AssertionError(
                f"LogAppendTime {appended} outside the exchange [{sent}, {received}]: the broker's "
                "clock and this one disagree"
            )
        return Exchange(
            kind="produce",
            user=self.user,
            client_id=self.client_id,
            sent_ms=sent,
            received_ms=received,
            earliest_ms=max(sent, appended),
            counted_bytes=len(request.encode(header=True)),
            throttle_ms=int(response.throttle_time_ms),
            offset=int(partition.base_offset),
            served=True,
        )

    def fetch(self, topic: str, offset: int) -> Exchange:
        request = fetch_request(topic, offset, partition_max_bytes=1, max_bytes=1 << 20)
        sent, response, received = self._exchange(request)
        if response.error_code:
            raise kafka.errors.for_code(response.error_code)(f"fetch from {topic}")
        records = b""
        for topic_response in response.responses:
            for partition in topic_response.partitions:
                if partition.error_code:
                    raise kafka.errors.for_code(partition.error_code)(f"fetch from {topic}")
                records += partition.records or b""
        return Exchange(
            kind="fetch",
            user=self.user,
            client_id=self.client_id,
            sent_ms=sent,
            received_ms=received,
            earliest_ms=sent,
            counted_bytes=FETCH_COUNTED_HEADER + len(response.encode()),
            throttle_ms=int(response.throttle_time_ms),
            offset=offset,
            served=bool(records),
        )

    def _exchange(self, request: Any) -> tuple[int, Any, int]:
        """Sends ``request`` once the connection is ready (a throttled connection is paused by
        kafka-python until the broker's throttle time is over) and returns (sent ms, response,
        received ms)."""
        deadline = time.monotonic() + _REQUEST_TIMEOUT_MS / 1000
        while not self._client.is_ready(self._node):
            if time.monotonic() > deadline:
                raise kafka.errors.KafkaConnectionError(f"node {self._node} not ready")
            self._client.maybe_connect(self._node)
            self._client.poll(timeout_ms=max(1.0, self._client.throttle_delay(self._node)))
        sent = time.time_ns() // 1_000_000
        future = self._client.send(self._node, request)
        self._client.poll(timeout_ms=_REQUEST_TIMEOUT_MS, future=future)
        received = time.time_ns() // 1_000_000
        if not future.succeeded():
            raise future.exception or kafka.errors.KafkaTimeoutError("no response")
        return sent, future.value, received
