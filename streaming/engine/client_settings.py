"""kafka-python settings given as text (``kafka.client`` in the engine's YAML or environment, a
Spark source option), typed as kafka-python takes them.

Environment variables and Spark options are text, and kafka-python does not convert: a request
timeout of ``"60000"`` fails inside the client at its first comparison, and ``"false"`` for a
flag is true. Each setting is typed as kafka-python's own default for it is (a flag, a whole
number, or text), and a name that none of the engine's clients knows is refused, so that a bad
setting is named when the engine starts rather than when a client first needs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

#: The clients the engine opens with ``kafka.client``: the settings each takes, and their defaults.
CLIENTS = (KafkaConsumer, KafkaProducer, KafkaAdminClient)
#: Whole-number settings that also take a word.
_WORDS = {"acks": ("all",)}


class ClientSettingError(ValueError):
    """A setting that no client takes, or a value not of its type (the message shows the value:
    typed settings are flags and numbers, never secrets; the caller names the setting)."""


def typed_setting(name: str, text: str) -> Any:
    """``text`` as kafka-python takes setting ``name``: ``true``/``false`` for a flag, a whole
    number for a number (unless it is one of the words the setting also takes), text otherwise."""
    default = _default_of(name)
    if isinstance(default, bool):
        word = text.strip().lower()
        if word not in ("true", "false"):
            raise ClientSettingError(f"must be true or false, got {text!r}")
        return word == "true"
    if isinstance(default, int):
        if text.strip().lower() in _WORDS.get(name, ()):
            return text.strip().lower()
        try:
            return int(text)
        except ValueError:
            raise ClientSettingError(f"must be a whole number, got {text!r}") from None
    return text


def settings_for(
    client_class: type[KafkaConsumer] | type[KafkaProducer] | type[KafkaAdminClient],
    settings: Mapping[str, Any],
    **defaults: Any,
) -> dict[str, Any]:
    """What to build a ``client_class`` with: the engine's ``defaults`` for it, under those of
    ``settings`` (``kafka.client``) that it takes. ``kafka.client`` holds the settings of all
    the engine's clients, and kafka-python refuses one it does not know; one it names twice is
    an error too, so a user's setting overrides the engine's."""
    taken = {name: value for name, value in settings.items() if name in client_class.DEFAULT_CONFIG}
    return {**defaults, **taken}


def _default_of(name: str) -> Any:
    for client_class in CLIENTS:
        if name in client_class.DEFAULT_CONFIG:
            return client_class.DEFAULT_CONFIG[name]
    raise ClientSettingError(
        "is not a setting of kafka-python's consumer, producer or admin client"
    )
