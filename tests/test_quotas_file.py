"""What the comments of the shipped ``conf/quotas.yaml`` say its entries do, checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from state.config import parse_quota_config
from state.quota_types import QuotaType
from state.resolution import ClientPairs, QuotaResolver, Sharing

QUOTAS = Path(__file__).resolve().parent.parent / "conf" / "quotas.yaml"
#: A client-id <default> quota is level 8 of Kafka's precedence.
CLIENT_ID_DEFAULT_LEVEL = 8


def _resolve(document: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(level, limit, sharing) of produce for clients of every kind the file names, and others."""
    users = np.array(["ANONYMOUS", "alice", "analytics", "ingest", "ingest"], dtype=object)
    clients = np.array(["app", "", "reports", "bulk-loader", "other"], dtype=object)
    pairs = ClientPairs(users, clients, np.arange(len(users)), np.arange(len(clients)))
    resolution = QuotaResolver(parse_quota_config(document, str(QUOTAS))).client(
        QuotaType.PRODUCE, pairs
    )
    return resolution.level, resolution.limit, resolution.sharing


def test_the_client_id_default_entry_applies_only_once_user_default_sets_no_produce_rate() -> None:
    document = yaml.safe_load(QUOTAS.read_text())
    client_default = next(c for c in document["clients"] if c.get("client_id") == "<default>")
    assert "user" not in client_default
    level, _, _ = _resolve(document)
    assert CLIENT_ID_DEFAULT_LEVEL not in level  # as shipped: user <default> (level 6) wins
    assert set(level) == {6, 1}
    for entry in document["clients"]:
        if entry.get("user") == "<default>" and "client_id" not in entry:
            del entry["producer_byte_rate"]
    level, limit, sharing = _resolve(document)
    takes_over = level == CLIENT_ID_DEFAULT_LEVEL
    # Every client with a client-id but ingest's bulk-loader (an empty client-id finds no
    # client-id quota: Kafka's quotaLimit).
    assert list(takes_over) == [True, False, True, False, True]
    assert set(limit[takes_over]) == {client_default["producer_byte_rate"]}
    assert set(sharing[takes_over]) == {Sharing.CLIENT}  # one counter per client-id
