"""Kafka's remote log metadata topic read in tests."""

from __future__ import annotations

from tests.servers import topic_records

METADATA_TOPIC = "__remote_log_metadata"


def metadata_values(address: str) -> list[bytes]:
    """Every value in ``__remote_log_metadata`` now, partition by partition."""
    return [record.value for record in topic_records(address, METADATA_TOPIC)]
