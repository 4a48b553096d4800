"""Outages of a server the engine or an agent depends on: one clock for all of them.

A server that stops answering is either down for a moment (a restart, a leader moving) or gone.
Every caller that rides an outage out — the engine's Redis writes, each Kafka call of its source,
configuration log and dead-letter producer, the agents' cached lookups — does it the same way:

* one warning as the outage begins and one as it ends (however many attempts fail in between),
  so a log stays readable through a five-minute restart;
* counts of outages begun and attempts failed, for the metrics;
* with ``max_outage_s``, the moment to give up: :class:`OutageError`, naming the server, how long
  it was waited for and the last error. With ``max_outage_s=None`` nothing is ridden out: the
  first failure is raised as it is (for commands that must answer promptly).

The clock is injectable (``clock``, :mod:`quotastream.clock`: monotonic seconds time an outage,
wall milliseconds stamp when it began); nothing here sleeps or retries by itself: callers pace
their attempts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from quotastream.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)


class OutageError(ConnectionError):
    """A server stayed unreachable for longer than the caller may wait (``max_outage_s``)."""


@dataclass(frozen=True)
class OutageStatus:
    """What an outage clock reports: for a status file, a metric or a test."""

    #: Wall-clock time (ms) the current outage began; None while the server answers.
    since_ms: int | None
    #: Outages begun (transitions from answering to not answering).
    outages: int
    #: Failed attempts, in every outage.
    failures: int


class Outage:
    def __init__(
        self,
        server: str,
        max_outage_s: float | None,
        *,
        meanwhile: str = "",
        clock: Clock = SYSTEM_CLOCK,
        on_change: Callable[[OutageStatus], None] | None = None,
        logger: logging.Logger = log,
    ) -> None:
        """``server`` names it in every message ("Kafka at host:9092"); ``meanwhile`` says what
        the caller does while it waits ("answering from the cache"). ``on_change`` is told each
        new status (a failed attempt, the end of an outage)."""
        self.server = server
        self.max_outage_s = max_outage_s
        self.meanwhile = meanwhile or (
            f"waiting up to {max_outage_s:g} s for it" if max_outage_s else "waiting for it"
        )
        self.outages = 0
        self.failures = 0
        self._clock = clock
        self._on_change = on_change
        self._log = logger
        self._since: float | None = None
        self._since_ms: int | None = None
        self._outage_failures = 0

    @property
    def down(self) -> bool:
        """True from a failed attempt until the next successful one."""
        return self._since is not None

    def down_for_s(self) -> float:
        """How long the current outage has lasted; 0 while the server answers."""
        return 0.0 if self._since is None else self._clock.monotonic() - self._since

    def status(self) -> OutageStatus:
        return OutageStatus(self._since_ms, self.outages, self.failures)

    def failed(self, error: BaseException) -> bool:
        """Counts a failed attempt; True if it began an outage.

        Raises ``error`` itself when nothing is ridden out (``max_outage_s=None``), and
        :class:`OutageError` once the outage has lasted ``max_outage_s``.
        """
        if self.max_outage_s is None:
            raise error
        now = self._clock.monotonic()
        self.failures += 1
        self._outage_failures += 1
        began = self._since is None
        if began:
            self._since, self._since_ms = now, self._clock.wall_ms()
            self.outages += 1
            self._log.warning(
                "%s unreachable (%s); %s", self.server, first_line(error), self.meanwhile
            )
        self._changed()
        assert self._since is not None
        if now - self._since >= self.max_outage_s:
            attempts = self._outage_failures
            raise OutageError(
                f"{self.server} unreachable for more than {self.max_outage_s:g} s "
                f"({attempts} failed attempt{'s' if attempts != 1 else ''}): {first_line(error)}"
            ) from None
        return began

    def recovered(self) -> float | None:
        """A successful attempt; the length of the outage it ended (None if there was none)."""
        if self._since is None:
            return None
        lasted = self._clock.monotonic() - self._since
        self._log.warning(
            "%s reachable again after %.1f s (%d failed attempts)",
            self.server,
            lasted,
            self._outage_failures,
        )
        self._since = self._since_ms = None
        self._outage_failures = 0
        self._changed()
        return lasted

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.status())


def run_passes(
    one_pass: Callable[[], object],
    *,
    every_s: float,
    stopped: threading.Event,
    outage: Outage,
    errors: tuple[type[BaseException], ...],
) -> None:
    """``one_pass()`` every ``every_s`` until ``stopped``: an agent's loop. A pass that fails
    with one of ``errors`` counts toward ``outage`` (logged as it begins and ends) and the next
    pass tries again; any other error ends the loop."""
    while not stopped.is_set():
        try:
            one_pass()
        except errors as error:
            outage.failed(error)
        else:
            outage.recovered()
        stopped.wait(every_s)


def first_line(error: BaseException) -> str:
    """An error's first line, for a one-line report (tracebacks stay in the debug log)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
