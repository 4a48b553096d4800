"""Closing a kafka-python producer within a time limit, as Java's ``close(timeout)`` does.

kafka-python's ``close(timeout)`` flushes first, and when the flush times out it raises before
the force close that should follow (3.0.12). The producer stays open: its I/O thread outlives
its owner, logs the servers' shutdown as errors and keeps retrying, and its ``__del__`` raises
again. That happens whenever Kafka holds a producer at its close: down, or throttling it (the
proxy mutes a held client as a broker would). :func:`close_producer` finishes such a close.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from kafka.errors import Cancelled, KafkaTimeoutError

#: How long a producer may take at its close to send what it buffered.
CLOSE_TIMEOUT_S: Final = 5.0
#: Where kafka-python's producer I/O thread logs each request that failed.
sender_log: Final = logging.getLogger("kafka.producer.sender")


def longest_close_s(timeout_s: float = CLOSE_TIMEOUT_S) -> float:
    """How long :func:`close_producer` may take: ``timeout_s`` to send what the producer
    buffered, and as long again for its I/O thread to stop once forced (failing the rest)."""
    return 2 * timeout_s


def close_producer(producer: Any, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
    """Closes ``producer`` within :func:`longest_close_s`; False if it dropped records it could
    not send in ``timeout_s``. Their futures fail (``IllegalStateError``), so a caller counting
    drops in errbacks counts them; reporting the drop is the caller's, once."""
    try:
        producer.close(timeout=timeout_s)
    except KafkaTimeoutError:
        # No public call does this: kafka-python's own close would, past its flush.
        sender = producer._sender
        cancelled = _CancelledBy(str(sender))
        sender_log.addFilter(cancelled)
        try:
            sender.force_close()
            sender.join(timeout_s)
        finally:
            sender_log.removeFilter(cancelled)
        producer.close(timeout=0)
        return False
    return True


class _CancelledBy(logging.Filter):
    """Drops the I/O thread's error for each request in flight that its force close cancels:
    the records' failed futures say it, and one error a request would bury the caller's line."""

    def __init__(self, sender: str) -> None:
        super().__init__()
        self._sender = sender

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (
            isinstance(args, tuple)
            and args[:1] == (self._sender,)
            and isinstance(args[-1], Cancelled)
        )
