"""Kafka frames, request headers, and the few message bodies the proxy reads or rewrites.

Everything else crosses the proxy as opaque frames: a frame is a 4-byte big-endian length and
that many bytes. The bodies the proxy must decode (small responses with broker addresses, SASL
exchanges, ApiVersions) go through kafka-python's codecs, which are generated from Kafka's own
message schemas (tagged fields included); the hot path reads only a request's header, a
Produce request's ``acks`` and a response's ``throttle_time_ms``, by hand, at known offsets.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any, Final

from kafka.protocol.admin import DescribeClusterResponse
from kafka.protocol.api_key import ApiKey
from kafka.protocol.consumer.fetch import FetchResponse
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


def throttle_offset(api_key: int, api_version: int, payload: memoryview) -> int | None:
    """Where a Fetch response's ``throttle_time_ms`` sits (its first body field, v1+); None for
    other responses (a Produce response's sits after its topics: it is decoded instead)."""
    if api_key != FETCH or api_version < 1:
        return None
    return response_header_size(api_key, api_version, payload)


def read_int32(payload: memoryview | bytearray, offset: int) -> int:
    value: int = _INT32.unpack_from(payload, offset)[0]
    return value


def write_int32(payload: bytearray, offset: int, value: int) -> None:
    _INT32.pack_into(payload, offset, value)
