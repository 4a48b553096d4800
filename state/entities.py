"""Readable entity keys, built for many entities at once (Arrow compute kernels, not a loop).

``user=alice,client-id=app1``, ``user=alice``, ``client-id=app1`` for client counters (Kafka's
metric tags), ``broker=1`` for broker quotas, ``cluster`` for a cluster-scoped broker quota; with
per-broker scope a client key ends in ``,broker=N``. Names are percent-escaped (``%``, ``,``,
``=``) so a key always splits back into its parts.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from state.resolution import Sharing

ObjectArray = npt.NDArray[np.object_]
Int64Array = npt.NDArray[np.int64]

CLUSTER = "cluster"
_ESCAPES = (("%", "%25"), (",", "%2C"), ("=", "%3D"))  # "%" first, so escapes stay intact


def escape(names: ObjectArray) -> pa.Array:
    escaped = pa.array(names, type=pa.string())
    if not pc.any(pc.match_substring_regex(escaped, "[%,=]")).as_py():
        return escaped  # the common case: nothing to escape
    for raw, code in _ESCAPES:
        escaped = pc.replace_substring(escaped, raw, code)
    return escaped


def client_keys(
    sharing: Int64Array, users: ObjectArray, clients: ObjectArray, brokers: Int64Array | None
) -> ObjectArray:
    """The usage-counter key of each client entity under its sharing rule."""
    user, client = escape(users), escape(clients)
    by_sharing = {
        Sharing.USER_AND_CLIENT: pc.binary_join_element_wise(
            "user=", user, ",client-id=", client, ""
        ),
        Sharing.USER: pc.binary_join_element_wise("user=", user, ""),
        Sharing.CLIENT: pc.binary_join_element_wise("client-id=", client, ""),
    }
    order = sorted(by_sharing)
    choice = pa.array(np.searchsorted(np.array(order), sharing), type=pa.int8())
    keys = pc.choose(choice, *(by_sharing[s] for s in order))
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
