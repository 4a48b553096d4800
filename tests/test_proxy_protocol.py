"""The proxy's protocol modules, pure: frames, headers, rewritten responses, logins and usage.

Every message is a real one, built and encoded with kafka-python's schema-driven codecs (the
same codecs the proxy decodes with), and every frame crosses the functions as bytes.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.admin import DescribeClusterResponse
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
)

from quotastream.address import Address, parse_addresses
from quotastream.client import QuotaClient
from quotastream.proxy import wire
from quotastream.proxy.frames import FrameReader
from quotastream.proxy.handler import ANONYMOUS
from quotastream.proxy.identity import (
    Identity,
    UnreadablePrincipalError,
    plain_user,
    scram_user,
)
from quotastream.proxy.routing import Routes, advertised_versions
from quotastream.proxy.usage import FETCH, PRODUCE, UsageSums
from state.config import parse_quota_config

ADVERTISED = "proxy.example.com"
PORT_BASE = 19_000
CORRELATION_ID = 4242


# --- building real frames --------------------------------------------------------------------


def request_frame(message: Any, correlation_id: int = 7, client_id: str | None = "c") -> bytes:
    message.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(message.encode(header=True, framed=True))


def response_frame(message: Any, correlation_id: int = CORRELATION_ID) -> bytes:
    message.with_header(correlation_id=correlation_id)
    return bytes(message.encode(header=True, framed=True))


def payload_of(frame: bytes) -> memoryview:
    assert wire.frame_size(frame) == len(frame) - 4
    return memoryview(frame)[4:]


def produce_request(version: int, acks: int, transactional_id: str | None) -> Any:
    topic = ProduceRequest.TopicProduceData
    partition = topic.PartitionProduceData(index=3, records=b"\x00record-batch-bytes")
    if version >= 13:
        data = topic(topic_id=uuid.UUID(int=99), partition_data=[partition])
    else:
        data = topic(name="orders", partition_data=[partition])
    return ProduceRequest[version](
        transactional_id=transactional_id, acks=acks, timeout_ms=30_000, topic_data=[data]
    )


def produce_response(version: int, endpoints: list[tuple[int, str, int]]) -> Any:
    topic = ProduceResponse.TopicProduceResponse
    partition = topic.PartitionProduceResponse(index=0, error_code=0, base_offset=41)
    if version >= 13:
        responses = [topic(topic_id=uuid.UUID(int=7), partition_responses=[partition])]
    else:
        responses = [topic(name="orders", partition_responses=[partition])]
    return ProduceResponse[version](
        responses=responses,
        throttle_time_ms=25,
        node_endpoints=[
            ProduceResponse.NodeEndpoint(node_id=node, host=host, port=port, rack="r1")
            for node, host, port in endpoints
        ],
    )


def fetch_response(
    version: int, endpoints: list[tuple[int, str, int]], throttle_time_ms: int = 25
) -> Any:
    topic = FetchResponse.FetchableTopicResponse
    partition = topic.PartitionData(partition_index=0, high_watermark=10, records=b"\x01batch")
    if version >= 13:
        responses = [topic(topic_id=uuid.UUID(int=7), partitions=[partition])]
    else:
        responses = [topic(topic="orders", partitions=[partition])]
    return FetchResponse[version](
        throttle_time_ms=throttle_time_ms,
        responses=responses,
        node_endpoints=[
            FetchResponse.NodeEndpoint(node_id=node, host=host, port=port, rack=None)
            for node, host, port in endpoints
        ],
    )


def metadata_response(version: int, brokers: list[tuple[int, str, int]]) -> Any:
    broker = MetadataResponse.MetadataResponseBroker
    return MetadataResponse[version](
        brokers=[
            broker(node_id=node, host=host, port=port, rack=None) for node, host, port in brokers
        ],
        cluster_id="cluster-a",
        controller_id=brokers[0][0],
        topics=[],
    )


def find_coordinator_response(version: int, coordinators: list[tuple[int, str, int]]) -> Any:
    if version < 4:
        ((node, host, port),) = coordinators
        return FindCoordinatorResponse[version](error_code=0, node_id=node, host=host, port=port)
    return FindCoordinatorResponse[version](
        coordinators=[
            FindCoordinatorResponse.Coordinator(
                key=f"group-{index}", node_id=node, host=host, port=port, error_code=0
            )
            for index, (node, host, port) in enumerate(coordinators)
        ]
    )


def describe_cluster_response(version: int, brokers: list[tuple[int, str, int]]) -> Any:
    broker = DescribeClusterResponse.DescribeClusterBroker
    return DescribeClusterResponse[version](
        cluster_id="cluster-a",
        controller_id=brokers[0][0],
        brokers=[broker(broker_id=node, host=host, port=port) for node, host, port in brokers],
    )


def addresses(api_key: int, version: int, message: Any) -> list[tuple[int, str, int]]:
    """Every (node id, host, port) a response tells its client."""
    if api_key == wire.METADATA:
        return [(b.node_id, b.host, b.port) for b in message.brokers]
    if api_key == wire.FIND_COORDINATOR:
        nodes = [message] if version < 4 else message.coordinators
        return [(c.node_id, c.host, c.port) for c in nodes]
    if api_key == wire.DESCRIBE_CLUSTER:
        return [(b.broker_id, b.host, b.port) for b in message.brokers]
    return [(e.node_id, e.host, e.port) for e in message.node_endpoints]


def build_response(api_key: int, version: int, nodes: list[tuple[int, str, int]]) -> Any:
    builders = {
        wire.METADATA: metadata_response,
        wire.FIND_COORDINATOR: find_coordinator_response,
        wire.DESCRIBE_CLUSTER: describe_cluster_response,
        wire.PRODUCE: produce_response,
        wire.FETCH: fetch_response,
    }
    return builders[api_key](version, nodes)


#: Every (API, version) whose response names brokers, as far as the codecs go.
ADDRESS_RESPONSES = [
    *((wire.METADATA, v) for v in range(MetadataResponse.max_version + 1)),
    *((wire.FIND_COORDINATOR, v) for v in range(FindCoordinatorResponse.max_version + 1)),
    *((wire.DESCRIBE_CLUSTER, v) for v in range(DescribeClusterResponse.max_version + 1)),
    *((wire.PRODUCE, v) for v in range(10, ProduceResponse.max_version + 1)),
    *((wire.FETCH, v) for v in range(16, FetchResponse.max_version + 1)),
]


def upstream(node_id: int) -> tuple[int, str, int]:
    return node_id, f"upstream-{node_id}.brokers.internal", 9092 + node_id


# --- wire: request headers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "client_id"),
    [
        pytest.param(produce_request(3, 1, None), "producer-1", id="produce-v3"),
        pytest.param(produce_request(9, -1, "tx"), "producer-1", id="produce-v9-flexible"),
        pytest.param(MetadataRequest[0](topics=[]), "meta", id="metadata-v0"),
        pytest.param(MetadataRequest[12](topics=None), "meta", id="metadata-v12-flexible"),
        pytest.param(ApiVersionsRequest[0](), None, id="api_versions-v0-null-client"),
        pytest.param(
            ApiVersionsRequest[3](client_software_name="qs", client_software_version="1"),
            None,
            id="api_versions-v3-flexible-null-client",
        ),
        pytest.param(
            SaslHandshakeRequest[1](mechanism="PLAIN"), "prödücer-é-🚀", id="handshake-v1-unicode"
        ),
        pytest.param(
            SaslAuthenticateRequest[2](auth_bytes=b"\x00alice\x00pw"),
            "prödücer-é-🚀",
            id="authenticate-v2-flexible-unicode",
        ),
    ],
)
def test_request_header_is_read_for_flexible_and_older_versions(
    message: Any, client_id: str | None
) -> None:
    frame = request_frame(message, correlation_id=123_456, client_id=client_id)
    header = wire.read_request_header(payload_of(frame))
    assert header.api_key == message.API_KEY
    assert header.api_version == message.API_VERSION
    assert header.correlation_id == 123_456
    assert header.client_id == client_id
    # The client-id is counted in bytes, not characters.
    assert header.end == 10 + (0 if client_id is None else len(client_id.encode()))


@pytest.mark.parametrize(
    "message",
    [
        SaslHandshakeRequest[0](mechanism="SCRAM-SHA-256"),
        SaslHandshakeRequest[1](mechanism="PLAIN"),
        SaslAuthenticateRequest[0](auth_bytes=b"n,,n=alice,r=abc"),
        SaslAuthenticateRequest[2](auth_bytes=b"n,,n=alice,r=abc"),
        ApiVersionsRequest[2](),
        ApiVersionsRequest[4](client_software_name="librdkafka", client_software_version="2.6"),
    ],
    ids=lambda message: f"{message.name}-v{message.API_VERSION}",
)
def test_decoded_request_bodies_start_after_the_header_and_its_tagged_fields(
    message: Any,
) -> None:
    payload = payload_of(request_frame(message, client_id="client-ü"))
    decoded = wire.decode_request(wire.read_request_header(payload), payload)
    assert decoded.to_dict() == message.to_dict()


def test_a_null_client_id_ends_the_header_after_its_length() -> None:
    payload = memoryview(struct.pack(">hhih", wire.PRODUCE, 7, 1, -1) + b"body")
    header = wire.read_request_header(payload)
    assert header == wire.RequestHeader(wire.PRODUCE, 7, 1, None, 10)


def test_an_empty_client_id_is_an_empty_string_not_null() -> None:
    header = wire.read_request_header(memoryview(struct.pack(">hhih", 1, 4, 9, 0)))
    assert header.client_id == ""
    assert header.end == 10


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"", "no complete header"),
        (struct.pack(">hhi", 0, 9, 1), "no complete header"),  # no client-id length
        (struct.pack(">hhih", 0, 9, 1, 0)[:9], "no complete header"),
        (struct.pack(">hhih", 0, 9, 1, 20) + b"abc", "client-id of 20 bytes overruns"),
        (struct.pack(">hhih", -1, 0, 1, 0), "api key -1"),
        (struct.pack(">hhih", -32768, 3, 1, 0), "api key -32768"),
        (struct.pack(">hhih", 0, -1, 1, 0), "version -1"),
        (struct.pack(">hhih", 0, 9, 1, 2) + b"\xff\xfe", "not UTF-8"),
    ],
)
def test_malformed_request_headers_are_refused(payload: bytes, match: str) -> None:
    with pytest.raises(wire.MalformedFrameError, match=match):
        wire.read_request_header(memoryview(payload))


# --- wire: produce acks ----------------------------------------------------------------------


@pytest.mark.parametrize("version", range(3, ProduceRequest.max_version + 1))
@pytest.mark.parametrize("acks", [0, 1, -1])
@pytest.mark.parametrize("transactional_id", [None, "", "tx-ümlaut-0001"])
def test_produce_acks_are_read_in_place_for_every_version(
    version: int, acks: int, transactional_id: str | None
) -> None:
    payload = payload_of(request_frame(produce_request(version, acks, transactional_id)))
    header = wire.read_request_header(payload)
    assert wire.produce_acks(header, payload) == acks


def test_produce_acks_skip_tagged_fields_in_a_flexible_request_header() -> None:
    frame = request_frame(produce_request(11, -1, "tx"), client_id="c")
    payload = bytes(payload_of(frame))
    header = wire.read_request_header(memoryview(payload))
    assert payload[header.end] == 0  # kafka-python writes no tagged fields: add two
    tagged = b"\x02" + b"\x00\x03abc" + b"\x05\x00"
    payload = payload[: header.end] + tagged + payload[header.end + 1 :]
    assert wire.produce_acks(header, memoryview(payload)) == -1


@pytest.mark.parametrize("version", range(3))
@pytest.mark.parametrize("acks", [1, -1])
def test_produce_acks_of_versions_without_a_transactional_id(version: int, acks: int) -> None:
    # Produce v0-2 have no transactional_id: acks is the body's first field. Kafka 3.x brokers
    # accept these versions, and advertised_versions keeps the broker's minimum.
    payload = payload_of(request_frame(produce_request(version, acks, None)))
    header = wire.read_request_header(payload)
    assert wire.produce_acks(header, payload) == acks


@pytest.mark.parametrize(
    "body",
    [
        b"",  # ends at the header
        b"\x00",  # half a transactional id length
        b"\x00\x05tx",  # a transactional id that overruns
        b"\xff\xff\x00",  # null transactional id, half an acks
    ],
    ids=["no-body", "half-length", "overrun-id", "half-acks"],
)
def test_a_truncated_produce_request_is_malformed(body: bytes) -> None:
    payload = memoryview(struct.pack(">hhih", wire.PRODUCE, 3, 1, 1) + b"c" + body)
    header = wire.read_request_header(payload)
    with pytest.raises(wire.MalformedFrameError):
        wire.produce_acks(header, payload)


def test_a_truncated_flexible_produce_request_is_malformed() -> None:
    header_bytes = struct.pack(">hhih", wire.PRODUCE, 9, 1, 1) + b"c"
    for body in (b"", b"\x00", b"\x00\x01", b"\x00\x05tx", b"\x00\x80"):
        payload = memoryview(header_bytes + body)
        header = wire.read_request_header(payload)
        with pytest.raises(wire.MalformedFrameError):
            wire.produce_acks(header, payload)


# --- wire: response headers, throttles, decode/encode ----------------------------------------


@pytest.mark.parametrize(
    ("api_key", "version", "size"),
    [
        (wire.METADATA, 8, 4),
        (wire.METADATA, 9, 5),
        (wire.PRODUCE, 8, 4),
        (wire.PRODUCE, 9, 5),
        (wire.FETCH, 11, 4),
        (wire.FETCH, 12, 5),
        (wire.FIND_COORDINATOR, 2, 4),
        (wire.FIND_COORDINATOR, 3, 5),
        (wire.DESCRIBE_CLUSTER, 0, 5),
        (wire.SASL_HANDSHAKE, 1, 4),
        (wire.SASL_AUTHENTICATE, 2, 5),
        (wire.API_VERSIONS, 0, 4),
        (wire.API_VERSIONS, 3, 4),  # flexible body, header v0 always
        (wire.API_VERSIONS, 4, 4),
        (2, 8, 4),  # an API the proxy never decodes: only the correlation id is known
    ],
)
def test_response_header_size_by_flexibility(api_key: int, version: int, size: int) -> None:
    payload = memoryview(struct.pack(">i", 1) + b"\x00" + b"body")
    assert wire.response_header_size(api_key, version, payload) == size


def test_response_header_size_skips_tagged_fields() -> None:
    payload = memoryview(struct.pack(">i", 1) + b"\x02" + b"\x00\x02ab" + b"\x01\x00" + b"body")
    assert wire.response_header_size(wire.METADATA, 12, payload) == 4 + 1 + 4 + 2


@pytest.mark.parametrize(
    "tail",
    [b"", b"\x01", b"\x01\x00", b"\x01\x00\x05ab", b"\x80"],
    ids=["none", "no-tag", "no-size", "overrun", "varint"],
)
def test_truncated_response_header_tagged_fields_are_malformed(tail: bytes) -> None:
    with pytest.raises(wire.MalformedFrameError):
        wire.response_header_size(wire.METADATA, 12, memoryview(struct.pack(">i", 1) + tail))


def busy_response(api_key: int, version: int, endpoints: list[tuple[int, str, int]]) -> Any:
    """A Produce or Fetch response with everything the in-place walk must step over: two
    topics of two partitions, record errors and error messages, aborted transactions, records,
    and partition-level tagged fields (a current leader), which are not NodeEndpoints."""
    if api_key == wire.PRODUCE:
        topic = ProduceResponse.TopicProduceResponse
        partition = topic.PartitionProduceResponse
        error = partition.BatchIndexAndErrorMessage(batch_index=1, batch_index_error_message="bad")
        partitions = [
            partition(
                index=i,
                error_code=6,
                base_offset=-1,
                record_errors=[error, error],
                error_message="not the leader",
                current_leader=partition.LeaderIdAndEpoch(leader_id=2, leader_epoch=9),
            )
            for i in range(2)
        ]
        responses = [
            topic(topic_id=uuid.UUID(int=t), partition_responses=partitions)
            if version >= 13
            else topic(name=f"t{t}", partition_responses=partitions)
            for t in range(2)
        ]
        return ProduceResponse[version](
            responses=responses,
            throttle_time_ms=25,
            node_endpoints=[
                ProduceResponse.NodeEndpoint(node_id=n, host=h, port=p, rack=None)
                for n, h, p in endpoints
            ],
        )
    topic = FetchResponse.FetchableTopicResponse
    data = topic.PartitionData
    fetched = [
        data(
            partition_index=i,
            high_watermark=10,
            aborted_transactions=[data.AbortedTransaction(producer_id=5, first_offset=3)],
            current_leader=data.LeaderIdAndEpoch(leader_id=2, leader_epoch=9),
            records=b"\x01" * (100 + i),
        )
        for i in range(2)
    ]
    topics = [
        topic(topic_id=uuid.UUID(int=t), partitions=fetched)
        if version >= 13
        else topic(topic=f"t{t}", partitions=fetched)
        for t in range(2)
    ]
    return FetchResponse[version](
        throttle_time_ms=25,
        responses=topics,
        node_endpoints=[
            FetchResponse.NodeEndpoint(node_id=n, host=h, port=p, rack="r") for n, h, p in endpoints
        ],
    )


THROTTLED_RESPONSES = [(wire.FETCH, v) for v in range(1, FetchResponse.max_version + 1)] + [
    (wire.PRODUCE, v) for v in range(1, ProduceResponse.max_version + 1)
]


@pytest.mark.parametrize(("api_key", "version"), THROTTLED_RESPONSES)
@pytest.mark.parametrize("endpoints", [[], [(1, "upstream-1", 9092), (3, "upstream-3", 9093)]])
def test_the_throttle_and_node_endpoints_are_found_in_place(
    api_key: int, version: int, endpoints: list[tuple[int, str, int]]
) -> None:
    frame = response_frame(busy_response(api_key, version, endpoints))
    payload = payload_of(frame)
    found = wire.throttled_response(api_key, version, payload)
    assert found.throttle_offset is not None
    assert wire.read_int32(payload, found.throttle_offset) == 25
    endpoints_since = 16 if api_key == wire.FETCH else 10
    assert found.tagged == (bool(endpoints) and version >= endpoints_since)
    raised = bytearray(frame)
    wire.write_int32(raised, 4 + found.throttle_offset, 5000)
    before = wire.decode_response(api_key, version, payload)
    after = wire.decode_response(api_key, version, payload_of(bytes(raised)))
    assert after.throttle_time_ms == 5000
    after.throttle_time_ms = before.throttle_time_ms
    assert after == before


@pytest.mark.parametrize("version", range(1, FetchResponse.max_version + 1))
def test_a_fetch_over_its_quota_is_answered_empty_with_the_brokers_error_and_session(
    version: int,
) -> None:
    """As a broker answers a fetch over its quota: no partitions, the throttle, and (v7+) the
    error code and fetch session id the broker answered with, so the client's session goes on."""
    message = busy_response(wire.FETCH, version, [(1, "upstream-1", 9092)])
    if version >= 7:
        message.error_code, message.session_id = 70, 4242
    payload = payload_of(response_frame(message))
    found = wire.throttled_response(wire.FETCH, version, payload)
    assert found.throttle_offset is not None
    emptied = wire.emptied_fetch_response(
        version, CORRELATION_ID, payload, found.throttle_offset, 1234
    )
    answer = payload_of(emptied)
    assert wire.read_int32(answer, 0) == CORRELATION_ID
    decoded = wire.decode_response(wire.FETCH, version, answer)
    assert (decoded.throttle_time_ms, decoded.responses) == (1234, [])
    if version >= 7:
        assert (decoded.error_code, decoded.session_id) == (70, 4242)
    if version >= 16:
        assert decoded.node_endpoints == []


def test_version_0_responses_carry_no_throttle() -> None:
    for api_key in (wire.FETCH, wire.PRODUCE):
        payload = payload_of(response_frame(busy_response(api_key, 0, [])))
        assert wire.throttled_response(api_key, 0, payload).throttle_offset is None


@pytest.mark.parametrize(("api_key", "version"), [(wire.FETCH, 16), (wire.PRODUCE, 10)])
def test_a_truncated_or_overlong_throttled_response_is_malformed(
    api_key: int, version: int
) -> None:
    frame = response_frame(busy_response(api_key, version, [(1, "h", 1)]))
    for cut in (frame[:-3], frame[:20], frame + b"\x00"):
        body = cut[4:]
        with pytest.raises(wire.MalformedFrameError):
            wire.throttled_response(api_key, version, memoryview(body))


def _round_trip_cases() -> list[Any]:
    cases: list[tuple[int, int, Any]] = [
        (api, version, build_response(api, version, [upstream(1), upstream(2)]))
        for api, version in ADDRESS_RESPONSES
        if not (api == wire.FIND_COORDINATOR and version < 4)
    ]
    cases += [
        (wire.FIND_COORDINATOR, v, find_coordinator_response(v, [upstream(2)])) for v in range(4)
    ]
    entry = ApiVersionsResponse.ApiVersion
    cases += [
        (
            wire.API_VERSIONS,
            v,
            ApiVersionsResponse[v](
                error_code=0,
                api_keys=[entry(api_key=0, min_version=3, max_version=13)],
                throttle_time_ms=0,
            ),
        )
        for v in range(ApiVersionsResponse.max_version + 1)
    ]
    return [pytest.param(*case, id=f"{wire.api_name(case[0])}-v{case[1]}") for case in cases]


@pytest.mark.parametrize(
    ("api_key", "version", "message"),
    _round_trip_cases(),
)
def test_decode_then_encode_response_gives_back_the_same_frame(
    api_key: int, version: int, message: Any
) -> None:
    frame = response_frame(message)
    decoded = wire.decode_response(api_key, version, payload_of(frame))
    assert version == decoded.API_VERSION
    if api_key != wire.API_VERSIONS:
        assert addresses(api_key, version, decoded) == addresses(api_key, version, message)
    encoded = wire.encode_response(api_key, version, CORRELATION_ID, decoded)
    assert encoded == frame
    assert wire.frame_size(encoded) == len(encoded) - 4


def test_a_too_new_api_versions_request_is_answered_in_v0() -> None:
    too_new = ApiVersionsResponse.max_version + 1
    # kafka-python cannot write this version: the request is built by hand (header v2).
    request = struct.pack(">hhih", wire.API_VERSIONS, too_new, 31, 1) + b"c" + b"\x00"
    request += b"\x03qs" + b"\x021" + b"\x00"
    header = wire.read_request_header(memoryview(request))
    assert (header.api_key, header.api_version) == (wire.API_VERSIONS, too_new)
    assert wire.body_offset(header, memoryview(request)) == header.end
    assert wire.decoded_response_version(wire.API_VERSIONS, too_new) == 0
    assert wire.decoded_response_version(wire.API_VERSIONS, too_new - 1) == too_new - 1
    assert wire.decoded_response_version(wire.METADATA, 12) == 12

    entry = ApiVersionsResponse.ApiVersion
    answer = ApiVersionsResponse[0](
        error_code=wire.UNSUPPORTED_VERSION,
        api_keys=[entry(api_key=wire.API_VERSIONS, min_version=0, max_version=4)],
    )
    frame = response_frame(answer, correlation_id=31)
    decoded = wire.decode_response(wire.API_VERSIONS, too_new, payload_of(frame))
    assert decoded.error_code == wire.UNSUPPORTED_VERSION
    assert [(e.api_key, e.max_version) for e in decoded.api_keys] == [(wire.API_VERSIONS, 4)]
    assert wire.encode_response(wire.API_VERSIONS, too_new, 31, decoded) == frame


def test_undecodable_response_bodies_are_malformed() -> None:
    frame = response_frame(metadata_response(12, [upstream(1)]))
    with pytest.raises(wire.MalformedFrameError, match="MetadataResponse v12"):
        wire.decode_response(wire.METADATA, 12, payload_of(frame)[:-6])


# --- routing ---------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    api=st.sampled_from(ADDRESS_RESPONSES),
    node_ids=st.lists(st.integers(0, 3000), min_size=1, max_size=5, unique=True),
)
def test_every_rewritten_address_points_at_the_proxy_port_of_its_node(
    api: tuple[int, int], node_ids: list[int]
) -> None:
    api_key, version = api
    if api_key == wire.FIND_COORDINATOR and version < 4:
        node_ids = node_ids[:1]
    nodes = [upstream(node) for node in node_ids]
    frame = response_frame(build_response(api_key, version, nodes))
    routes = Routes(ADVERTISED, PORT_BASE)

    decoded = wire.decode_response(api_key, version, payload_of(frame))
    assert routes.rewrite(api_key, version, decoded)
    out = wire.encode_response(api_key, version, CORRELATION_ID, decoded)

    told = addresses(api_key, version, wire.decode_response(api_key, version, payload_of(out)))
    assert told == [(node, ADVERTISED, PORT_BASE + node) for node in node_ids]
    assert b"upstream-" not in out
    if api_key == wire.METADATA:
        assert routes.brokers == {node: Address(host, port) for node, host, port in nodes}
    else:
        assert routes.brokers == {}  # only Metadata says which brokers exist


def test_responses_without_node_endpoints_are_left_alone() -> None:
    routes = Routes(ADVERTISED, PORT_BASE)
    for api_key, version in [(wire.PRODUCE, 10), (wire.PRODUCE, 9), (wire.FETCH, 16)]:
        message = build_response(api_key, version, [])
        assert not routes.rewrite(api_key, version, message)
    assert not routes.rewrite(wire.FETCH, 12, fetch_response(12, []))
    assert not routes.rewrite(wire.SASL_HANDSHAKE, 1, object())


@pytest.mark.parametrize("version", range(4))
def test_find_coordinator_without_a_coordinator_is_untouched_before_v4(version: int) -> None:
    message = FindCoordinatorResponse[version](
        error_code=15, error_message=None, node_id=-1, host="", port=-1
    )
    frame = response_frame(message)
    decoded = wire.decode_response(wire.FIND_COORDINATOR, version, payload_of(frame))
    assert not Routes(ADVERTISED, PORT_BASE).rewrite(wire.FIND_COORDINATOR, version, decoded)
    assert (decoded.node_id, decoded.host, decoded.port) == (-1, "", -1)
    assert wire.encode_response(wire.FIND_COORDINATOR, version, CORRELATION_ID, decoded) == frame


@pytest.mark.parametrize("version", range(4, FindCoordinatorResponse.max_version + 1))
def test_find_coordinator_rewrites_only_the_keys_with_a_coordinator(version: int) -> None:
    coordinator = FindCoordinatorResponse.Coordinator
    message = FindCoordinatorResponse[version](
        coordinators=[
            coordinator(key="lost", node_id=-1, host="", port=-1, error_code=15),
            coordinator(key="found", node_id=2, host="upstream-2", port=9094, error_code=0),
        ]
    )
    decoded = wire.decode_response(
        wire.FIND_COORDINATOR, version, payload_of(response_frame(message))
    )
    assert Routes(ADVERTISED, PORT_BASE).rewrite(wire.FIND_COORDINATOR, version, decoded)
    assert addresses(wire.FIND_COORDINATOR, version, decoded) == [
        (-1, "", -1),
        (2, ADVERTISED, PORT_BASE + 2),
    ]
    all_lost = FindCoordinatorResponse[version](
        coordinators=[coordinator(key="lost", node_id=-1, host="", port=-1, error_code=15)]
    )
    assert not Routes(ADVERTISED, PORT_BASE).rewrite(wire.FIND_COORDINATOR, version, all_lost)


def test_learn_reports_joined_and_left_nodes_and_routes_follow() -> None:
    changes: list[tuple[set[int], set[int]]] = []
    routes = Routes(
        ADVERTISED, PORT_BASE, on_change=lambda joined, left: changes.append((joined, left))
    )
    assert routes.upstream(1) is None

    routes.learn([(1, "k1", 9092), (2, "k2", 9092)])
    assert changes == [({1, 2}, set())]
    assert routes.upstream(1) == Address("k1", 9092)
    assert routes.node_of(Address("k2", 9092)) == 2
    assert routes.proxy_port(2) == PORT_BASE + 2

    routes.learn([(2, "k2", 9092), (1, "k1", 9092)])  # the same brokers: nothing to report
    assert len(changes) == 1

    routes.learn([(2, "k2-new", 9093), (3, "k3", 9092)])
    assert changes[1] == ({3}, {1})
    assert routes.upstream(1) is None
    assert routes.node_of(Address("k1", 9092)) is None
    assert routes.node_of(Address("k2", 9092)) is None  # moved: its old address is no broker
    assert routes.upstream(2) == Address("k2-new", 9093)
    assert routes.node_of(Address("k3", 9092)) == 3

    routes.learn([(2, "k2-moved-again", 9093)])  # a move alone opens or closes no port
    assert changes[2] == (set(), {3})
    assert routes.brokers == {2: Address("k2-moved-again", 9093)}


def test_a_metadata_response_teaches_the_brokers_it_lists() -> None:
    changes: list[tuple[set[int], set[int]]] = []
    routes = Routes(
        ADVERTISED, PORT_BASE, on_change=lambda joined, left: changes.append((joined, left))
    )
    first = metadata_response(12, [upstream(1), upstream(2)])
    routes.rewrite(wire.METADATA, 12, first)
    second = metadata_response(12, [upstream(2), upstream(5)])
    routes.rewrite(wire.METADATA, 12, second)
    assert changes == [({1, 2}, set()), ({5}, {1})]
    assert routes.upstream(5) == Address(*upstream(5)[1:])
    assert addresses(wire.METADATA, 12, second) == [
        (2, ADVERTISED, PORT_BASE + 2),
        (5, ADVERTISED, PORT_BASE + 5),
    ]


def _broker_versions() -> list[tuple[int, int, int]]:
    """A broker's ApiVersions (api key, min, max), newer than the codecs everywhere it can be."""
    return [
        (wire.PRODUCE, 3, 99),
        (wire.FETCH, 4, 99),
        (2, 1, 10),  # ListOffsets: the proxy never decodes it
        (wire.METADATA, 0, 99),
        (wire.FIND_COORDINATOR, 0, 99),
        (wire.SASL_HANDSHAKE, 0, 99),
        (wire.API_VERSIONS, 0, 99),
        (19, 2, 7),  # CreateTopics
        (wire.SASL_AUTHENTICATE, 0, 99),
        (wire.DESCRIBE_QUORUM, 0, 2),
        (wire.DESCRIBE_CLUSTER, 0, 99),
        (68, 0, 1),  # ConsumerGroupHeartbeat
        (wire.SHARE_FETCH, 1, 1),
        (wire.SHARE_ACKNOWLEDGE, 1, 1),
    ]


def test_advertised_versions_drop_unrewritten_apis_and_cap_decoded_ones() -> None:
    entry = ApiVersionsResponse.ApiVersion
    entries = [entry(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in _broker_versions()]
    kept = advertised_versions(entries)
    assert [(e.api_key, e.min_version, e.max_version) for e in kept] == [
        (wire.PRODUCE, 3, min(ProduceRequest.max_version, ProduceResponse.max_version)),
        (wire.FETCH, 4, FetchResponse.max_version),
        (2, 1, 10),
        (wire.METADATA, 0, MetadataResponse.max_version),
        (wire.FIND_COORDINATOR, 0, FindCoordinatorResponse.max_version),
        (wire.SASL_HANDSHAKE, 0, SaslHandshakeRequest.max_version),
        (wire.API_VERSIONS, 0, ApiVersionsResponse.max_version),
        (19, 2, 7),
        (wire.SASL_AUTHENTICATE, 0, SaslAuthenticateResponse.max_version),
        (wire.DESCRIBE_CLUSTER, 0, DescribeClusterResponse.max_version),
        (68, 0, 1),
    ]


def test_advertised_versions_keep_lower_maxima_and_drop_apis_left_with_no_version() -> None:
    entry = ApiVersionsResponse.ApiVersion
    entries = [
        entry(api_key=wire.METADATA, min_version=0, max_version=7),
        entry(api_key=wire.FETCH, min_version=FetchResponse.max_version + 1, max_version=99),
    ]
    kept = advertised_versions(entries)
    assert [(e.api_key, e.min_version, e.max_version) for e in kept] == [(wire.METADATA, 0, 7)]


def test_a_narrowed_api_versions_response_is_what_the_client_reads() -> None:
    entry = ApiVersionsResponse.ApiVersion
    message = ApiVersionsResponse[3](
        error_code=0,
        api_keys=[
            entry(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in _broker_versions()
        ],
        throttle_time_ms=0,
    )
    decoded = wire.decode_response(wire.API_VERSIONS, 3, payload_of(response_frame(message)))
    decoded.api_keys = advertised_versions(decoded.api_keys)
    out = wire.encode_response(wire.API_VERSIONS, 3, CORRELATION_ID, decoded)
    seen = wire.decode_response(wire.API_VERSIONS, 3, payload_of(out))
    keys = {e.api_key: e.max_version for e in seen.api_keys}
    assert not keys.keys() & {wire.DESCRIBE_QUORUM, wire.SHARE_FETCH, wire.SHARE_ACKNOWLEDGE}
    assert keys[wire.PRODUCE] == ProduceRequest.max_version
    assert keys[19] == 7


def test_parse_addresses_reads_bootstrap_servers() -> None:
    assert parse_addresses("k1:9092, k2.example.com:19092 ,[::1]:9093") == [
        Address("k1", 9092),
        Address("k2.example.com", 19092),
        Address("::1", 9093),
    ]
    assert str(Address("k1", 9092)) == "k1:9092"


@pytest.mark.parametrize(
    "bad", ["k2", "k2:", ":9092", "k2:0", "k2:65536", "k2:port", "k2:-1", "k2:90 92", ""]
)
def test_parse_addresses_names_the_bad_entry(bad: str) -> None:
    with pytest.raises(ValueError, match=f"^{bad!r} is not host:port$"):
        parse_addresses(f"k1:9092,{bad},k3:9092")


def test_parse_addresses_names_an_entry_whose_port_has_non_ascii_digits() -> None:
    # str.isdigit() accepts "²", which int() then refuses with its own message.
    with pytest.raises(ValueError, match="'k2:²' is not host:port"):
        parse_addresses("k1:9092,k2:²")


# --- identity --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "user"),
    [
        (b"\x00alice\x00secret", "alice"),
        (b"alice\x00alice\x00secret", "alice"),
        (b"\x00\xc3\xa9lise\x00", "élise"),  # an empty password is the broker's to refuse
    ],
)
def test_plain_user_is_the_authentication_id(message: bytes, user: str) -> None:
    assert plain_user(message) == user


@pytest.mark.parametrize(
    "message",
    [b"bob\x00alice\x00secret", b"alice\x00secret", b"\x00\x00secret", b"a\x00b\x00c\x00d"],
    ids=["other-authzid", "two-parts", "empty-user", "four-parts"],
)
def test_unreadable_plain_messages_are_refused(message: bytes) -> None:
    with pytest.raises(UnreadablePrincipalError):
        plain_user(message)


@pytest.mark.parametrize(
    ("message", "user"),
    [
        (b"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL", "alice"),
        (b"n,a=admin,n=alice,r=abc", "admin"),
        (b"y,,n=alice,r=abc", "alice"),
        (b"p=tls-unique,,n=alice,r=abc", "alice"),
        (b"n,,r=abc,n=late", "late"),
        (b"n,,n=us=2Cer=3Dname,r=abc", "us,er=name"),
        (b"n,a=ad=3Dmin=2C,n=alice,r=abc", "ad=min,"),
        (b"n,,n==3D2C,r=abc", "=2C"),  # "=" encoded, then the letters 2C
    ],
)
def test_scram_user_is_the_client_first_name_or_authzid(message: bytes, user: str) -> None:
    assert scram_user(message) == user


@pytest.mark.parametrize("message", [b"x,,n=alice,r=abc", b"n,,r=abc", b"", b"alice"], ids=str)
def test_unreadable_scram_messages_are_refused(message: bytes) -> None:
    with pytest.raises(UnreadablePrincipalError):
        scram_user(message)


def test_plain_user_is_recorded_once_the_broker_accepts_the_login() -> None:
    identity = Identity()
    assert identity.user == ANONYMOUS
    identity.handshake("PLAIN")
    identity.authenticate(b"\x00alice\x00secret")
    assert identity.user == ANONYMOUS  # read, not yet accepted
    identity.authenticated(0)
    assert identity.user == "alice"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_user_is_recorded_after_the_second_accepted_step(mechanism: str) -> None:
    identity = Identity()
    identity.handshake(mechanism)
    identity.authenticate(b"n,,n=alice,r=rOprNGfwEbeRWgbNEkqO")
    identity.authenticated(0)  # server-first: the login is not over
    assert identity.user == ANONYMOUS
    identity.authenticate(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF,p=dHzb")
    assert identity.user == ANONYMOUS
    identity.authenticated(0)
    assert identity.user == "alice"


@pytest.mark.parametrize(
    ("mechanism", "steps"),
    [
        ("PLAIN", [b"\x00alice\x00wrong"]),
        ("SCRAM-SHA-256", [b"n,,n=alice,r=abc"]),
        ("SCRAM-SHA-256", [b"n,,n=alice,r=abc", b"c=biws,r=abcdef,p=wrong"]),
    ],
)
def test_a_refused_login_leaves_the_connection_anonymous(
    mechanism: str, steps: list[bytes]
) -> None:
    identity = Identity()
    identity.handshake(mechanism)
    for step in steps[:-1]:
        identity.authenticate(step)
        identity.authenticated(0)
    identity.authenticate(steps[-1])
    identity.authenticated(58)  # SASL_AUTHENTICATION_FAILED
    assert identity.user == ANONYMOUS
    identity.authenticated(0)  # nothing pending any more: a stray success changes nothing
    assert identity.user == ANONYMOUS


@pytest.mark.parametrize("mechanism", ["OAUTHBEARER", "GSSAPI", "plain", "SCRAM-SHA-1"])
def test_mechanisms_whose_principal_is_unreadable_are_refused(mechanism: str) -> None:
    identity = Identity()
    with pytest.raises(UnreadablePrincipalError, match=mechanism):
        identity.handshake(mechanism)
    with pytest.raises(UnreadablePrincipalError, match="before any SaslHandshake"):
        identity.authenticate(b"\x00alice\x00secret")
    assert identity.user == ANONYMOUS


def test_a_login_that_is_not_utf8_is_unreadable() -> None:
    for mechanism, message in [("PLAIN", b"\x00\xff\x00pw"), ("SCRAM-SHA-256", b"n,,n=\xff,r=a")]:
        identity = Identity()
        identity.handshake(mechanism)
        with pytest.raises(UnreadablePrincipalError, match="not UTF-8"):
            identity.authenticate(message)


def test_reauthentication_switches_user_only_once_accepted() -> None:
    identity = Identity()
    identity.handshake("PLAIN")
    identity.authenticate(b"\x00alice\x00secret")
    identity.authenticated(0)

    identity.handshake("SCRAM-SHA-512")
    identity.authenticate(b"n,,n=bob,r=abc")
    identity.authenticated(0)
    identity.authenticate(b"c=biws,r=abcdef,p=proof")
    assert identity.user == "alice"
    identity.authenticated(0)
    assert identity.user == "bob"

    identity.handshake("PLAIN")
    identity.authenticate(b"\x00carol\x00wrong")
    identity.authenticated(58)
    assert identity.user == "bob"  # a refused re-login keeps the user the broker knows


def test_a_plain_login_read_off_the_wire() -> None:
    identity = Identity()
    for request in (
        SaslHandshakeRequest[1](mechanism="PLAIN"),
        SaslAuthenticateRequest[2](auth_bytes=b"\x00alice\x00secret"),
    ):
        payload = payload_of(request_frame(request))
        header = wire.read_request_header(payload)
        body = wire.decode_request(header, payload)
        if header.api_key == wire.SASL_HANDSHAKE:
            identity.handshake(body.mechanism)
        else:
            identity.authenticate(bytes(body.auth_bytes))
    response = SaslAuthenticateResponse[2](error_code=0, error_message=None, auth_bytes=b"")
    frame = response_frame(response)
    decoded = wire.decode_response(wire.SASL_AUTHENTICATE, 2, payload_of(frame))
    identity.authenticated(decoded.error_code)
    assert identity.user == "alice"


# --- FrameReader -----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=40), max_size=8),
    data=st.data(),
)
def test_any_split_of_a_stream_yields_exactly_its_frames_in_order(
    payloads: list[bytes], data: st.DataObject
) -> None:
    frames = [wire.framed(payload) for payload in payloads]
    stream = b"".join(frames)
    boundaries = {0}
    for frame in frames:
        boundaries.add(max(boundaries) + len(frame))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts"))
    reader = FrameReader(max_frame_bytes=40)
    seen: list[memoryview] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        seen += reader.feed(stream[start:end])
        assert reader.partial == (end not in boundaries)
        assert sum(len(frame) for frame in seen) == max(b for b in boundaries if b <= end)
    # Frames handed out earlier stay whole while later chunks arrive.
    assert [bytes(frame) for frame in seen] == frames


def test_a_frame_split_over_chunks_is_returned_once_whole() -> None:
    frame = wire.framed(b"0123456789")
    reader = FrameReader(max_frame_bytes=100)
    for index in range(len(frame) - 1):
        assert reader.feed(frame[index : index + 1]) == []
        assert reader.partial
    (whole,) = reader.feed(frame[-1:])
    assert bytes(whole) == frame
    assert not reader.partial


def test_a_partial_frame_after_whole_ones_is_kept() -> None:
    reader = FrameReader(max_frame_bytes=100)
    first, second = wire.framed(b"one"), wire.framed(b"second")
    got = reader.feed(first + second[:6])
    assert [bytes(frame) for frame in got] == [first]
    assert reader.partial
    assert [bytes(frame) for frame in reader.feed(second[6:])] == [second]
    assert not reader.partial


def test_empty_frames_and_the_largest_accepted_frame_pass() -> None:
    reader = FrameReader(max_frame_bytes=8)
    stream = wire.framed(b"") + wire.framed(b"x" * 8) + wire.framed(b"")
    assert [len(frame) for frame in reader.feed(stream)] == [4, 12, 4]


@pytest.mark.parametrize("size", [9, 1 << 30, -1, -(1 << 31)])
def test_oversized_and_negative_frame_lengths_are_malformed(size: int) -> None:
    reader = FrameReader(max_frame_bytes=8)
    with pytest.raises(wire.MalformedFrameError, match=f"a frame of {size} bytes"):
        reader.feed(struct.pack(">i", size))  # refused on the length alone
    later = FrameReader(max_frame_bytes=8)
    later.feed(wire.framed(b"ok")[:3])
    with pytest.raises(wire.MalformedFrameError):
        later.feed(wire.framed(b"ok")[3:] + struct.pack(">i", size))


# --- usage -----------------------------------------------------------------------------------

WINDOWS = {PRODUCE: 1000, FETCH: 2000}


def events_of(sums: UsageSums) -> dict[tuple[str, str, str, int, int], tuple[int, int]]:
    """(kind, user, client, broker, ts) -> (bytes, count), order aside."""
    return {(e.kind, e.user, e.client_id, e.broker, e.ts): (e.bytes, e.count) for e in sums.take()}


def test_usage_is_summed_per_kind_user_client_broker_and_sample() -> None:
    drops: list[tuple[str, int, int]] = []
    sums = UsageSums(WINDOWS, max_pending_sums=100, on_drop=lambda *d: drops.append(d))
    record = sums.record
    record(kind=PRODUCE, user="alice", client_id="c1", broker=1, nbytes=100, now_ms=10_000)
    record(kind=PRODUCE, user="alice", client_id="c1", broker=1, nbytes=50, now_ms=10_999)
    record(kind=PRODUCE, user="alice", client_id="c1", broker=1, nbytes=7, now_ms=11_000)
    record(kind=PRODUCE, user="alice", client_id="c2", broker=1, nbytes=1, now_ms=10_001)
    record(kind=PRODUCE, user="bob", client_id="c1", broker=1, nbytes=2, now_ms=10_002)
    record(kind=PRODUCE, user="alice", client_id="c1", broker=2, nbytes=3, now_ms=10_003)
    record(kind=FETCH, user="alice", client_id="c1", broker=1, nbytes=1000, now_ms=10_000)
    record(kind=FETCH, user="alice", client_id="c1", broker=1, nbytes=500, now_ms=11_500)
    assert len(sums) == 6
    assert events_of(sums) == {
        (PRODUCE, "alice", "c1", 1, 10_999): (150, 2),
        (PRODUCE, "alice", "c1", 1, 11_000): (7, 1),  # the next 1000 ms sample
        (PRODUCE, "alice", "c2", 1, 10_001): (1, 1),
        (PRODUCE, "bob", "c1", 1, 10_002): (2, 1),
        (PRODUCE, "alice", "c1", 2, 10_003): (3, 1),
        (FETCH, "alice", "c1", 1, 11_500): (1500, 2),  # one 2000 ms sample
    }
    assert drops == []
    assert len(sums) == 0
    assert sums.take() == []


def test_a_full_book_drops_new_keys_and_still_sums_existing_ones() -> None:
    drops: list[tuple[str, int, int]] = []
    sums = UsageSums(WINDOWS, max_pending_sums=2, on_drop=lambda *d: drops.append(d))
    sums.record(kind=PRODUCE, user="a", client_id="c", broker=1, nbytes=10, now_ms=1)
    sums.record(kind=FETCH, user="a", client_id="c", broker=1, nbytes=20, now_ms=2)
    sums.record(kind=PRODUCE, user="b", client_id="c", broker=1, nbytes=30, now_ms=3)
    sums.record(kind=PRODUCE, user="a", client_id="c", broker=1, nbytes=5000, now_ms=1000)
    sums.record(kind=PRODUCE, user="a", client_id="c", broker=1, nbytes=40, now_ms=4)
    assert drops == [("buffer_full", 1, 30), ("buffer_full", 1, 5000)]
    assert events_of(sums) == {
        (PRODUCE, "a", "c", 1, 4): (50, 2),
        (FETCH, "a", "c", 1, 2): (20, 1),
    }
    sums.record(kind=PRODUCE, user="b", client_id="c", broker=1, nbytes=30, now_ms=5)
    assert len(drops) == 2  # take() emptied the book: room again
    assert events_of(sums) == {(PRODUCE, "b", "c", 1, 5): (30, 1)}


@pytest.mark.parametrize("version", range(3, FetchRequest.max_version + 1))
def test_a_fetch_requests_max_bytes_is_found_and_rewritten_in_place(version: int) -> None:
    wanted = FetchRequest.FetchTopic
    partition = wanted.FetchPartition(partition=0, fetch_offset=7, partition_max_bytes=1 << 20)
    topic = (
        wanted(topic_id=uuid.UUID(int=5), partitions=[partition])
        if version >= 13
        else wanted(topic="orders", partitions=[partition])
    )
    request = FetchRequest[version](
        replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=52_428_800, topics=[topic]
    )
    request.with_header(correlation_id=3, client_id="consumer-ü")
    frame = bytearray(request.encode(header=True, framed=True))
    payload = memoryview(frame)[4:]
    header = wire.read_request_header(payload)
    offset = wire.fetch_max_bytes_offset(header, payload)
    assert offset is not None
    assert wire.read_int32(payload, offset) == 52_428_800
    wire.write_int32(frame, 4 + offset, 200_000)
    decoded = FetchRequest.decode(
        memoryview(frame)[4 + wire.body_offset(header, payload) :], version=version
    )
    assert decoded.max_bytes == 200_000
    assert decoded.max_wait_ms == 500
    assert decoded.topics[0].partitions[0].fetch_offset == 7


@pytest.mark.parametrize(
    ("fetch", "brokers", "largest"),
    [
        ({}, 3, 10 * 1_000_000),  # per broker: limit x (11 - 1) x 1 s, whatever the brokers
        ({"scope": "cluster"}, 4, 10 * 1_000_000 // 4),  # one window for the whole cluster
        ({"samples": 5, "window_ms": 2000}, 1, 4 * 2 * 1_000_000),
    ],
)
def test_the_largest_fetch_is_the_clients_fetch_quota_window(
    fetch: dict[str, Any], brokers: int, largest: int
) -> None:
    config = parse_quota_config(
        {
            "quota_types": {"fetch": fetch},
            "clients": [
                {"user": "<default>", "consumer_byte_rate": 1_000_000},
                {"user": "free", "exempt": True},
            ],
        },
        "test",
    )
    client = QuotaClient(redis.Redis(), config=config)  # resolved locally: never connected
    assert client.largest_fetch("alice", "app", 1, brokers) == largest
    assert client.largest_fetch("free", "app", 1, brokers) is None  # exempt: never held
