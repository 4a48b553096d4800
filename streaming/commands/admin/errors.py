"""The error that refuses an admin command, with its exit code
(``streaming/commands/exit_codes.py``)."""

from __future__ import annotations

from streaming.commands.exit_codes import EXIT_USAGE


class AdminError(Exception):
    """A refused command: its exit code and the message for ``quotastream: error: ...``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def bad(message: str) -> AdminError:
    return AdminError(EXIT_USAGE, message)
