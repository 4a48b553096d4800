"""Records of Kafka's ``__remote_log_metadata`` topic, decoded by Kafka's own message schemas.

The topic-based remote log metadata manager (``TopicBasedRemoteLogMetadataManager``) writes each
remote segment's lifecycle and each partition's deletion there, one record per event, with a
null key. A record's value is ``RemoteLogMetadataSerde``'s: three unsigned varints (the frame
version, 1; the message's api key; its version), then the message in Kafka's generated encoding
at a flexible version. The messages are the four ``"type": "metadata"`` schemas that ship inside
``kafka-storage-<version>.jar`` (``message/*.json``): they are read from the jar of the cluster's
own Kafka release at start, not copied here, so a release that changes them is decoded by its own
schemas, and a version the jar does not list is refused, never guessed.

kafka-python's schema-driven codec (``kafka.protocol.schemas.StructField``) does the decoding.
"""

from __future__ import annotations

import base64
import io
import json
import re
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka.protocol.data_container import DataContainer
from kafka.protocol.schemas import BaseField, StructField
from kafka.protocol.schemas.fields.codecs import UnsignedVarInt32

#: ``AbstractApiMessageSerde``'s frame version; Kafka refuses any other.
FRAME_VERSION = 1
#: The schemas of ``__remote_log_metadata`` (``RemoteLogMetadataSerde``), by name.
SEGMENT = "RemoteLogSegmentMetadataRecord"
SEGMENT_UPDATE = "RemoteLogSegmentMetadataUpdateRecord"
PARTITION_DELETE = "RemotePartitionDeleteMetadataRecord"
SEGMENT_SNAPSHOT = "RemoteLogSegmentMetadataSnapshotRecord"
SCHEMA_NAMES = (SEGMENT, SEGMENT_UPDATE, PARTITION_DELETE, SEGMENT_SNAPSHOT)

#: ``RemoteLogSegmentState`` and ``RemotePartitionDeleteState`` (kafka-storage-api): the ids the
#: records carry, by the names Kafka gives them.
SEGMENT_STATES = {
    0: "COPY_SEGMENT_STARTED",
    1: "COPY_SEGMENT_FINISHED",
    2: "DELETE_SEGMENT_STARTED",
    3: "DELETE_SEGMENT_FINISHED",
}
PARTITION_DELETE_STATES = {
    0: "DELETE_PARTITION_MARKED",
    1: "DELETE_PARTITION_STARTED",
    2: "DELETE_PARTITION_FINISHED",
}

_COMMENTS = re.compile(r"(?m)^\s*//.*\n?")


class UndecodableRecordError(ValueError):
    """A value that is not a record these schemas decode; the message says why."""


@dataclass(frozen=True)
class _Schema:
    name: str
    api_key: int
    versions: tuple[int, int]
    flexible: tuple[int, int] | None
    struct: StructField


@dataclass(frozen=True)
class Decoded:
    """A decoded record: its schema's name and version, and the message (snake_case fields,
    as kafka-python names them: ``remote_log_segment_id.topic_id_partition.name``, ...)."""

    name: str
    version: int
    message: Any


class RemoteLogMetadataSchemas:
    """The message schemas of one Kafka release, by api key."""

    def __init__(self, schemas: dict[int, _Schema]) -> None:
        self._by_key = schemas

    @classmethod
    def from_jar(cls, jar: Path) -> RemoteLogMetadataSchemas:
        """Reads the schemas from a ``kafka-storage`` jar; refuses a jar that lacks one."""
        schemas: dict[int, _Schema] = {}
        try:
            with zipfile.ZipFile(jar) as archive:
                for name in SCHEMA_NAMES:
                    try:
                        text = archive.read(f"message/{name}.json").decode()
                    except KeyError:
                        raise ValueError(
                            f"{jar} has no message/{name}.json: not a kafka-storage jar of a "
                            "release with tiered storage (3.6 or later)"
                        ) from None
                    schema = _schema(json.loads(_COMMENTS.sub("", text)))
                    schemas[schema.api_key] = schema
        except (OSError, zipfile.BadZipFile) as error:
            raise ValueError(f"cannot read Kafka's schemas from {jar}: {error}") from None
        return cls(schemas)

    def decode(self, value: bytes | None) -> Decoded:
        """The record ``value``, or :class:`UndecodableRecordError` with the reason."""
        if value is None:
            raise UndecodableRecordError("a record without a value")
        data = io.BytesIO(value)
        try:
            frame, api_key, version = (UnsignedVarInt32.decode(data) for _ in range(3))
        except Exception:
            raise UndecodableRecordError("a truncated frame header") from None
        if frame != FRAME_VERSION:
            raise UndecodableRecordError(f"frame version {frame}, not {FRAME_VERSION}")
        schema = self._by_key.get(api_key)
        if schema is None:
            raise UndecodableRecordError(f"api key {api_key}, which no schema of this release has")
        low, high = schema.versions
        if not low <= version <= high:
            raise UndecodableRecordError(
                f"{schema.name} version {version}; this release's schema has {low}..{high}"
            )
        flexible = schema.flexible is not None and (
            schema.flexible[0] <= version <= schema.flexible[1]
        )
        try:
            message = schema.struct.decode(data, version=version, compact=flexible, tagged=flexible)
        except Exception as error:
            raise UndecodableRecordError(f"a malformed {schema.name}: {error!r}") from None
        if data.read(1):
            raise UndecodableRecordError(f"bytes after the end of its {schema.name}")
        return Decoded(schema.name, version, message)


def kafka_uuid(value: uuid.UUID) -> str:
    """A Kafka ``Uuid`` as Kafka prints it (``Uuid.toString``: URL-safe base64, no padding)."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode()


def _schema(document: dict[str, Any]) -> _Schema:
    if document.get("type") != "metadata" or "apiKey" not in document:
        raise ValueError(f"{document.get('name')} is not a metadata record schema")
    struct = StructField(document)
    struct.set_data_class(type(document["name"], (DataContainer,), {"_struct": struct}))
    versions = BaseField.parse_versions(document["validVersions"])
    assert versions is not None
    return _Schema(
        name=document["name"],
        api_key=int(document["apiKey"]),
        versions=(versions[0], versions[1]),
        flexible=BaseField.parse_versions(document.get("flexibleVersions", "none")),
        struct=struct,
    )
