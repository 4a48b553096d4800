"""Kafka frames, request headers, and the few message bodies the proxy reads or rewrites.

Everything else crosses the proxy as opaque frames: a frame is a 4-byte big-endian length and
that many bytes. The bodies the proxy must decode (small responses with broker addresses, SASL
exchanges, ApiVersions) go through kafka-python's codecs, which are generated from Kafka's own
message schemas (tagged fields included); the hot path reads only a request's header, a
Produce request's ``acks`` and a response's ``throttle_time_ms``, by hand, at known offsets.
"""

from __future__ import annotations

import functools
import re
import struct
from dataclasses import dataclass
from typing import Any, Final

from kafka.protocol.admin import DescribeClusterResponse
from kafka.protocol.api_key import ApiKey
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorResponse,
    MetadataResponse,
)
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

PRODUCE: Final = 0
FETCH: Final = 1
METADATA: Final = 3
FIND_COORDINATOR: Final = 10
SASL_HANDSHAKE: Final = 17
API_VERSIONS: Final = 18
SASL_AUTHENTICATE: Final = 36
DESCRIBE_QUORUM: Final = 55
DESCRIBE_CLUSTER: Final = 60
SHARE_FETCH: Final = 78
SHARE_ACKNOWLEDGE: Final = 79

#: Kafka's error code for a request version the broker does not support.
UNSUPPORTED_VERSION: Final = 35

#: The messages whose bodies the proxy decodes, by API key: (request class, response class).
#: Their versions are capped at what these codecs know (``routing.advertised_versions``).
REQUESTS: Final[dict[int, Any]] = {
    PRODUCE: ProduceRequest,
    FETCH: FetchRequest,
    SASL_HANDSHAKE: SaslHandshakeRequest,
    SASL_AUTHENTICATE: SaslAuthenticateRequest,
    API_VERSIONS: ApiVersionsRequest,
}
RESPONSES: Final[dict[int, Any]] = {
    PRODUCE: ProduceResponse,
    FETCH: FetchResponse,
    METADATA: MetadataResponse,
    FIND_COORDINATOR: FindCoordinatorResponse,
    SASL_HANDSHAKE: SaslHandshakeResponse,
    API_VERSIONS: ApiVersionsResponse,
    SASL_AUTHENTICATE: SaslAuthenticateResponse,
    DESCRIBE_CLUSTER: DescribeClusterResponse,
}

#: Metric labels: each API's name in snake case (Kafka's names, from kafka-python's ``ApiKey``).
API_NAMES: Final = {int(key): re.sub(r"(?<!^)(?=[A-Z])", "_", key.name).lower() for key in ApiKey}

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_HEADER = struct.Struct(">hhi")


class MalformedFrameError(ValueError):
    """Bytes that are not a Kafka request or response this proxy can follow."""


def api_name(api_key: int) -> str:
    """A metric label for an API: its name, ``other`` for a key kafka-python does not know."""
    return API_NAMES.get(api_key, "other")


def frame_size(prefix: bytes | memoryview) -> int:
    """The length a frame's 4-byte prefix announces (the bytes after the prefix)."""
    size: int = _INT32.unpack_from(prefix)[0]
    return size


def framed(payload: bytes) -> bytes:
    return _INT32.pack(len(payload)) + payload


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """A request's header (``RequestHeader`` v1/v2): what routing, identity and usage need."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    #: Where the header's fixed part and client-id end (tagged fields follow on flexible ones).
    end: int


def read_request_header(payload: memoryview) -> RequestHeader:
    """The header of a request (``payload``: the frame without its length prefix)."""
    if len(payload) < _HEADER.size + 2:
        raise MalformedFrameError(f"a request of {len(payload)} bytes has no complete header")
    api_key, api_version, correlation_id = _HEADER.unpack_from(payload)
    if api_key < 0 or api_version < 0:
        raise MalformedFrameError(f"api key {api_key} version {api_version} is not a request")
    length = _INT16.unpack_from(payload, _HEADER.size)[0]
    start = _HEADER.size + 2
    if length < 0:
        return RequestHeader(api_key, api_version, correlation_id, None, start)
    if start + length > len(payload):
        raise MalformedFrameError(f"a client-id of {length} bytes overruns its request")
    try:
        client_id = bytes(payload[start : start + length]).decode()
    except UnicodeDecodeError:
        raise MalformedFrameError("the client-id is not UTF-8") from None
    return RequestHeader(api_key, api_version, correlation_id, client_id, start + length)


def _uvarint(data: memoryview, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if offset >= len(data) or shift > 28:
            raise MalformedFrameError("a truncated or oversized varint")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7


def _skip_tagged_fields(data: memoryview, offset: int) -> int:
    count, offset = _uvarint(data, offset)
    for _ in range(count):
        _tag, offset = _uvarint(data, offset)
        size, offset = _uvarint(data, offset)
        offset += size
    if offset > len(data):
        raise MalformedFrameError("tagged fields overrun their frame")
    return offset


@functools.cache
def _flexible(message: Any, version: int) -> bool:
    return bool(message.flexible_version_q(version))


def body_offset(header: RequestHeader, payload: memoryview) -> int:
    """Where the body of a request the proxy decodes begins."""
    request = REQUESTS[header.api_key]
    if header.api_key == API_VERSIONS and header.api_version > request.max_version:
        return header.end  # too new to know: only its header is read (``api_versions_request``)
    if not _flexible(request, header.api_version):
        return header.end
    return _skip_tagged_fields(payload, header.end)


def produce_acks(header: RequestHeader, payload: memoryview) -> int:
    """A Produce request's ``acks`` (0: the broker sends no response), read in place."""
    offset = body_offset(header, payload)
    if _flexible(ProduceRequest, header.api_version):
        length, offset = _uvarint(payload, offset)
        offset += max(length - 1, 0)  # a compact nullable string: length + 1, 0 for null
    elif header.api_version >= 3:  # v3 added the transactional id before acks
        if offset + 2 > len(payload):
            raise MalformedFrameError("a Produce request ends in its transactional id")
        length = _INT16.unpack_from(payload, offset)[0]
        offset += 2 + max(length, 0)
    if offset + 2 > len(payload):
        raise MalformedFrameError("a Produce request ends before its acks")
    acks: int = _INT16.unpack_from(payload, offset)[0]
    return acks


def expects_response(header: RequestHeader, payload: memoryview) -> bool:
    """Whether the broker answers the request: all do but an ``acks=0`` Produce."""
    return header.api_key != PRODUCE or produce_acks(header, payload) != 0


def fetch_max_bytes_offset(header: RequestHeader, payload: memoryview) -> int | None:
    """Where a Fetch request's ``max_bytes`` sits (v3+: after ``replica_id`` (v0-14),
    ``max_wait_ms`` and ``min_bytes``); None before v3, which has none."""
    if header.api_version < 3:
        return None
    offset = body_offset(header, payload) + (12 if header.api_version < 15 else 8)
    if offset + 4 > len(payload):
        raise MalformedFrameError("a Fetch request ends before its max_bytes")
    return offset


def decode_request(header: RequestHeader, payload: memoryview) -> Any:
    """The body of a request the proxy decodes (SASL, ApiVersions), as kafka-python's object."""
    request = REQUESTS[header.api_key]
    try:
        return request.decode(payload[body_offset(header, payload) :], version=header.api_version)
    except MalformedFrameError:
        raise
    except Exception as error:  # kafka-python raises whatever its codecs hit on bad bytes
        raise MalformedFrameError(f"{request.__name__} v{header.api_version}: {error}") from None


def response_header_size(api_key: int, api_version: int, payload: memoryview) -> int:
    """The response header's size: the correlation id, and tagged fields on flexible versions
    (ApiVersions keeps header v0 at every version, so that any client can read it)."""
    response = RESPONSES.get(api_key)
    if response is None or api_key == API_VERSIONS or not _flexible(response, api_version):
        return 4
    return _skip_tagged_fields(payload, 4)


def decoded_response_version(api_key: int, api_version: int) -> int:
    """The version a response is written in: as requested, except an ApiVersions request too
    new for the broker, which it answers in v0 (with UNSUPPORTED_VERSION)."""
    if api_key == API_VERSIONS and api_version > ApiVersionsResponse.max_version:
        return 0
    return api_version


def decode_response(api_key: int, api_version: int, payload: memoryview) -> Any:
    response = RESPONSES[api_key]
    version = decoded_response_version(api_key, api_version)
    start = response_header_size(api_key, version, payload)
    try:
        return response.decode(payload[start:], version=version)
    except Exception as error:  # kafka-python raises whatever its codecs hit on bad bytes
        raise MalformedFrameError(f"{response.__name__} v{version}: {error}") from None


def encode_response(api_key: int, api_version: int, correlation_id: int, message: Any) -> bytes:
    """A whole response frame (length prefix, header, body)."""
    response = RESPONSES[api_key]
    version = decoded_response_version(api_key, api_version)
    header = _INT32.pack(correlation_id)
    if api_key != API_VERSIONS and _flexible(response, version):
        header += b"\x00"  # no tagged fields
    # Decoded messages carry their version (kafka-python's encode(version=) fails on them).
    assert version == message.API_VERSION
    body: bytes = message.encode()
    return framed(header + body)


@dataclass(frozen=True, slots=True)
class ThrottledResponse:
    """Where a Produce or Fetch response's ``throttle_time_ms`` sits, and whether it carries
    top-level tagged fields (KIP-951 ``NodeEndpoints``, which must be rewritten)."""

    throttle_offset: int | None  # None: a version without one (v0)
    tagged: bool


def throttled_response(api_key: int, api_version: int, payload: memoryview) -> ThrottledResponse:
    """Finds the throttle and the tagged fields of a Produce or Fetch response by skipping over
    its structure in place: no field is decoded, no record copied. Kafka puts the throttle
    first in a Fetch response (v1+) and after the topics in a Produce response (v1+); the
    tagged fields that carry ``NodeEndpoints`` (Produce v10+, Fetch v16+) end the response,
    after every topic and record of a fetch."""
    try:
        if api_key == FETCH:
            return _fetch_response(api_version, payload)
        return _produce_response(api_version, payload)
    except (IndexError, struct.error):
        raise MalformedFrameError(
            f"a truncated {api_name(api_key)} v{api_version} response"
        ) from None


def _skip_compact_string(data: memoryview, offset: int) -> int:
    length, offset = _uvarint(data, offset)
    return offset + max(length - 1, 0)  # length + 1; 0 for null


def _produce_response(version: int, data: memoryview) -> ThrottledResponse:
    if version < 1:
        return ThrottledResponse(None, tagged=False)
    if not _flexible(ProduceResponse, version):
        return ThrottledResponse(len(data) - 4, tagged=False)  # the throttle ends v1-v8
    offset = response_header_size(PRODUCE, version, data)
    topics, offset = _uvarint(data, offset)
    for _ in range(topics - 1):
        offset = offset + 16 if version >= 13 else _skip_compact_string(data, offset)
        partitions, offset = _uvarint(data, offset)
        for _ in range(partitions - 1):
            offset += 4 + 2 + 8 + 8 + 8  # index, error, base offset, append time, start offset
            record_errors, offset = _uvarint(data, offset)
            for _ in range(record_errors - 1):
                offset = _skip_compact_string(data, offset + 4)
                offset = _skip_tagged_fields(data, offset)
            offset = _skip_compact_string(data, offset)  # error message
            offset = _skip_tagged_fields(data, offset)
        offset = _skip_tagged_fields(data, offset)
    return _ending(data, offset)


def _fetch_response(version: int, data: memoryview) -> ThrottledResponse:
    if version < 1:
        return ThrottledResponse(None, tagged=False)
    start = response_header_size(FETCH, version, data)
    if version < 16:  # no NodeEndpoints to look for
        return ThrottledResponse(start, tagged=False)
    offset = start + 4 + 2 + 4  # throttle, error, session id
    topics, offset = _uvarint(data, offset)
    for _ in range(topics - 1):
        offset += 16  # topic id (v13+)
        partitions, offset = _uvarint(data, offset)
        for _ in range(partitions - 1):
            offset += 4 + 2 + 8 + 8 + 8  # index, error, high watermark, LSO, log start
            aborted, offset = _uvarint(data, offset)
            for _ in range(aborted - 1):
                offset = _skip_tagged_fields(data, offset + 16)
            offset += 4  # preferred read replica
            offset = _skip_compact_string(data, offset)  # the records: skipped, never read
            offset = _skip_tagged_fields(data, offset)
        offset = _skip_tagged_fields(data, offset)
    return _ending(data, offset, throttle_offset=start)


def _ending(data: memoryview, offset: int, throttle_offset: int | None = None) -> ThrottledResponse:
    """The response's last part: (a Produce response's throttle, then) its tagged fields."""
    if throttle_offset is None:
        throttle_offset, offset = offset, offset + 4
    if offset >= len(data):
        raise IndexError(offset)
    count, _ = _uvarint(data, offset)
    if _skip_tagged_fields(data, offset) != len(data):
        raise MalformedFrameError("a response does not end where its fields do")
    return ThrottledResponse(throttle_offset, tagged=count > 0)


def emptied_fetch_response(
    api_version: int,
    correlation_id: int,
    payload: memoryview,
    throttle_offset: int,
    throttle_ms: int,
) -> bytes:
    """The empty twin of a Fetch response, as a broker answers a fetch over its quota
    (``KafkaApis.handleFetchRequest``: no partitions, ``throttle_time_ms`` set, its bytes
    un-recorded). The broker's error code and fetch session id (v7+) are kept, so the client's
    fetch session goes on as the broker has it; the records are never decoded."""
    version = decoded_response_version(FETCH, api_version)
    fields: dict[str, object] = {"throttle_time_ms": throttle_ms, "responses": []}
    if version >= 7:
        fields["error_code"] = _INT16.unpack_from(payload, throttle_offset + 4)[0]
        fields["session_id"] = read_int32(payload, throttle_offset + 6)
    message = RESPONSES[FETCH](version=version, **fields)
    return encode_response(FETCH, api_version, correlation_id, message)


def fetch_counted_bytes(api_version: int, payload: memoryview, tagged: bool) -> int:
    """What a broker's fetch quota records for a Fetch response (``FetchResponse.sizeOf``): its
    size without the response header, and without the ``NodeEndpoints`` it adds after counting
    (``tagged``: the response carries them; then it is decoded, a rare case: a leader moved)."""
    header_size = response_header_size(FETCH, api_version, payload)
    if not tagged:
        return len(payload) - header_size + 4
    message = decode_response(FETCH, api_version, payload)
    message.node_endpoints = []
    unpointed = encode_response(FETCH, api_version, read_int32(payload, 0), message)
    return len(unpointed) - header_size


def read_int32(payload: memoryview | bytearray, offset: int) -> int:
    value: int = _INT32.unpack_from(payload, offset)[0]
    return value


def write_int32(payload: bytearray, offset: int, value: int) -> None:
    _INT32.pack_into(payload, offset, value)
