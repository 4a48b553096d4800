"""Keeping secrets (Redis and Kafka passwords, keys) out of messages and logs."""

from __future__ import annotations

import logging

from streaming.engine.settings import EngineSettings

_MASK = "***"
#: Shorter values ("true", "SSL") are settings, not secrets worth masking everywhere.
_MIN_SECRET_LENGTH = 4


def secrets_of(settings: EngineSettings) -> list[str]:
    """Every secret value of the settings, longest first (so none is masked only in part)."""
    # Flags and numbers are settings, not secrets.
    values = [
        value for value in settings.kafka.client_settings().values() if isinstance(value, str)
    ]
    if settings.redis.password is not None:
        values.append(settings.redis.password.get_secret_value())
    return sorted({v for v in values if len(v) >= _MIN_SECRET_LENGTH}, key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, _MASK)
    return text


class RedactingFilter(logging.Filter):
    """Masks secrets in every record that passes through a handler it is attached to."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            message = record.getMessage()
            masked = redact(message, self.secrets)
            if masked != message:
                record.msg, record.args = masked, None
            if record.exc_info and record.exc_text is None:
                record.exc_text = redact(
                    logging.Formatter().formatException(record.exc_info), self.secrets
                )
                record.exc_info = None
        return True


def redact_logs(settings: EngineSettings) -> None:
    """Masks the settings' secrets in everything logged through the root logger's handlers."""
    secrets = secrets_of(settings)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter(secrets))
