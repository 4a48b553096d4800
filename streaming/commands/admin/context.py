"""What one admin command works with: its settings, the quota file and the configuration log."""

from __future__ import annotations

import argparse
import getpass
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quotastream.clock import SYSTEM_CLOCK
from state.config import QuotaConfig, load_quota_config
from state.configfile import ConfigError
from state.live_config import Change, LiveConfig, apply_change, describe_change
from streaming.commands.admin.errors import bad
from streaming.commands.redaction import redact, secrets_of
from streaming.engine.settings import EngineSettings, load_engine_settings

if TYPE_CHECKING:
    from quotastream.client import QuotaClient
    from streaming.engine.config_log import ConfigLog


@dataclass
class Admin:
    """One command's settings, base configuration and connection to the configuration log."""

    args: argparse.Namespace
    settings: EngineSettings
    base: QuotaConfig
    timeout_ms: int
    _log: ConfigLog | None = field(default=None, repr=False)

    @staticmethod
    def load(args: argparse.Namespace) -> Admin:
        settings = load_engine_settings(args.engine_config)
        base = load_quota_config(Path(settings.quotas))
        return Admin(args, settings, base, max(int(args.timeout * 1000), 1))

    @property
    def log(self) -> ConfigLog | None:
        """The configuration log; None when ``kafka.config_topic`` is null (no live changes)."""
        kafka = self.settings.kafka
        if kafka.config_topic is None:
            return None
        if self._log is None:
            from streaming.engine.config_log import ConfigLog  # noqa: PLC0415

            client = {**kafka.client_settings(), "bootstrap_timeout_ms": self.timeout_ms}
            self._log = ConfigLog(
                kafka.bootstrap_servers, kafka.config_topic, client, timeout_ms=self.timeout_ms
            )
        return self._log

    def live(self) -> LiveConfig:
        """The newest version of the live configuration."""
        return self.log.current(self.base) if self.log is not None else LiveConfig(0, self.base)

    def write(self, live: LiveConfig, changes: Sequence[Change]) -> list[int]:
        """Validates ``changes`` in order over ``live``, then appends them; their versions.

        Nothing is written when one of them is invalid. Prints one line per change.
        """
        config = live.config
        for change in changes:
            try:
                config = apply_change(config, change)
            except ConfigError as exc:
                raise bad(f"refused, nothing written: {exc}") from None
        if self.args.dry_run:
            for change in changes:
                print(f"dry run, not written: {describe_change(change)}")
            return []
        log = self.log
        if log is None:
            raise bad(
                "kafka.config_topic is null in the engine settings: there is no live "
                f"configuration to change; edit the quota file ({self.settings.quotas}) instead"
            )
        log.ensure_topic()
        versions = []
        for change in changes:
            # Printed as each is written: if Kafka fails halfway, the output says what was.
            versions.append(log.append(change))
            print(f"version {versions[-1]}: {describe_change(change)}", flush=True)
        # Another operator may have appended in between: check that ours still applied.
        after = live.advanced(log.read(live.version, versions[-1]))
        skipped = {s.version: s.reason for s in after.skipped}
        refused = [f"version {v} is skipped: {skipped[v]}" for v in versions if v in skipped]
        if refused:
            raise bad(
                "written, but a change made concurrently makes it invalid: " + "; ".join(refused)
            )
        return versions

    def stamp(self) -> dict[str, Any]:
        """``at_ms`` and ``by`` for a change."""
        by = self.args.by if self.args.by else _default_author()
        return {"at_ms": SYSTEM_CLOCK.wall_ms(), "by": by}

    def scrub(self, message: str) -> str:
        """``message`` without any secret of the settings in it."""
        return redact(message, secrets_of(self.settings))

    def redis_client(self, config: QuotaConfig | None) -> QuotaClient:
        from quotastream.client import QuotaClient  # noqa: PLC0415

        # One attempt: --timeout bounds the wait, not redis-py's backoff (up to 10 s).
        return QuotaClient.connect(
            prefix=self.settings.redis.key_prefix,
            config=config,
            timeout_s=self.timeout_ms / 1000,
            **self.settings.redis.connection(),
        )

    def close(self) -> None:
        if self._log is not None:
            self._log.close()


def _default_author() -> str:
    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
