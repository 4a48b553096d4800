"""Every ``quotastream`` command's exit codes (the table in ``docs/operations.md``)."""

from __future__ import annotations

from typing import Final

#: Done: the command did what it was asked.
EXIT_OK: Final = 0
#: It failed while running: unreadable input, a value in Redis that is not the engine's, the
#: streaming query stopping on an error.
EXIT_FAILURE: Final = 1
#: It was used wrongly: a bad option or argument, a bad configuration file or value.
EXIT_USAGE: Final = 2
#: A server it needs (Kafka, Redis) does not answer or refuses it; nothing was changed.
EXIT_UNREACHABLE: Final = 3
