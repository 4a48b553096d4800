"""Readable entity keys, built for many entities at once (Arrow compute kernels, not a loop).

``user=alice,client-id=app1``, ``user=alice``, ``client-id=app1`` for client counters (Kafka's
metric tags), ``broker=1`` for broker quotas, ``cluster`` for a cluster-scoped broker quota; with
per-broker scope a client key ends in ``,broker=N``. Names are percent-escaped (``%``, ``,``,
``=``) so a key always splits back into its parts.
"""

from __future__ import annotations

from urllib.parse import unquote

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from state.quota_rules import ESCAPES, KEY_PARTS

ObjectArray = npt.NDArray[np.object_]
Int64Array = npt.NDArray[np.int64]

CLUSTER = "cluster"


def escape(names: ObjectArray) -> pa.Array:
    escaped = pa.array(names, type=pa.string())
    if not pc.any(pc.match_substring_regex(escaped, "[%,=]")).as_py():
        return escaped  # the common case: nothing to escape
    for raw, code in ESCAPES:
        escaped = pc.replace_substring(escaped, raw, code)
    return escaped


#: The parts of an entity key, in order, by kind of quota (``cluster`` is a part with no value).
_CLIENT_SHAPES = tuple(
    (*names, *scope) for names in KEY_PARTS.values() for scope in ((), ("broker",))
)
_BROKER_SHAPES = (("broker",), (CLUSTER,))
_PARTITION_SHAPES = tuple((*shape, "topic", "partition") for shape in _BROKER_SHAPES)


def entity_key_problem(entity: str, client_quota: bool, partitions: bool = False) -> str | None:
    """What is wrong with ``entity`` as a key of a client quota (``client_quota``) or of a broker
    quota (with ``partitions``: ``remote_copy``'s per-partition keys too); None if nothing.

    The shapes are those :func:`client_keys`, :func:`broker_keys` and
    ``copy_fairness.partition_keys`` write: ``name=value`` parts in a fixed order, names
    percent-escaped, broker and partition numbers.
    """
    parts = [part.partition("=") for part in entity.split(",")]
    names = tuple(name for name, _, _ in parts)
    if client_quota:
        shapes, example = _CLIENT_SHAPES, "user=alice,client-id=app1,broker=1"
    else:
        shapes, example = _BROKER_SHAPES + (_PARTITION_SHAPES if partitions else ()), "broker=1"
    if names not in shapes or any((name == CLUSTER) == bool(eq) for name, eq, _ in parts):
        return f"{entity!r} is not an entity key of this quota (e.g. {example!r})"
    for name, _, value in parts:
        if name in ("broker", "partition") and not value.isdigit():
            return f"{entity!r}: {name} must be a number, got {value!r}"
        if name == "topic" and not value:
            return f"{entity!r}: the topic is empty"
    return None


def parse_entity_key(entity: str) -> dict[str, str]:
    """The parts of an entity key by name, names unescaped: the inverse of the key builders.

    ``user=a%2Cb,client-id=app1,broker=1`` gives ``{"user": "a,b", "client-id": "app1",
    "broker": "1"}``; ``cluster`` is a part with an empty value. Pure and lenient (no shape
    check: :func:`entity_key_problem` does that), so a reader of keys the engine wrote, such as
    the metrics exporter, never fails on one.
    """
    parts = (part.partition("=") for part in entity.split(","))
    return {name: unquote(value) for name, _, value in parts}


def client_keys(
    sharing: Int64Array, users: ObjectArray, clients: ObjectArray, brokers: Int64Array | None
) -> ObjectArray:
    """The usage-counter key of each client entity under its sharing rule."""
    # Only the rules in use are joined: most configurations share every counter one way.
    present = np.unique(sharing).tolist()
    of_part = {"user": users, "client-id": clients}
    names = {part: escape(of_part[part]) for rule in present for part in KEY_PARTS[rule]}
    by_sharing = [
        pc.binary_join_element_wise(
            *(
                piece
                for position, part in enumerate(KEY_PARTS[rule])
                for piece in (("," if position else "") + part + "=", names[part])
            ),
            "",
        )
        for rule in present
    ]
    if len(present) <= 1:
        keys = by_sharing[0] if by_sharing else pa.array([], pa.string())
    else:
        choice = pa.array(np.searchsorted(np.array(present), sharing), type=pa.int8())
        keys = pc.choose(choice, *by_sharing)
    if brokers is not None:
        keys = pc.binary_join_element_wise(keys, ",broker=", _as_text(brokers), "")
    return _to_objects(keys)


def broker_keys(brokers: Int64Array | None, size: int = 0) -> ObjectArray:
    """``broker=N`` per broker, or ``cluster`` (``size`` times) when usage is cluster-wide."""
    if brokers is None:
        return np.full(size, CLUSTER, dtype=object)
    return _to_objects(pc.binary_join_element_wise("broker=", _as_text(brokers), ""))


def _as_text(values: Int64Array) -> pa.Array:
    return pc.cast(pa.array(values, type=pa.int64()), pa.string())


def _to_objects(keys: pa.Array) -> ObjectArray:
    return np.asarray(keys.to_numpy(zero_copy_only=False), dtype=object)
