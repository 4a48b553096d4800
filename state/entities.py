"""Readable entity keys, built for many entities at once.

``user=alice,client-id=app1``, ``user=alice``, ``client-id=app1`` for client counters (Kafka's
metric tags), ``broker=1`` for broker quotas, ``cluster`` for a cluster-scoped broker quota; with
per-broker scope a client key ends in ``,broker=N``. Names are percent-escaped (``%``, ``,``,
``=``) so a key always splits back into its parts.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

from state.resolution import Sharing

ObjectArray = npt.NDArray[np.object_]
Int64Array = npt.NDArray[np.int64]

CLUSTER = "cluster"


def escape(names: ObjectArray) -> pd.Series:
    series = pd.Series(names, dtype=object)
    return series.str.replace("%", "%25").str.replace(",", "%2C").str.replace("=", "%3D")


def client_keys(
    sharing: Int64Array, users: ObjectArray, clients: ObjectArray, brokers: Int64Array | None
) -> ObjectArray:
    """The usage-counter key of each client entity under its sharing rule."""
    user_part = "user=" + escape(users)
    client_part = "client-id=" + escape(clients)
    keys = np.where(
        sharing == Sharing.USER_AND_CLIENT,
        user_part + "," + client_part,
        np.where(sharing == Sharing.USER, user_part, client_part),
    ).astype(object)
    if brokers is not None:
        keys = (pd.Series(keys, dtype=object) + broker_keys(brokers, prefix=",")).to_numpy()
    return keys


def broker_keys(brokers: Int64Array | None, size: int = 0, prefix: str = "") -> ObjectArray:
    """``broker=N`` per broker, or ``cluster`` (``size`` times) when usage is cluster-wide."""
    if brokers is None:
        return np.full(size, CLUSTER, dtype=object)
    return (prefix + "broker=" + pd.Series(brokers).astype(str)).to_numpy(dtype=object)
