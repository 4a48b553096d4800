"""The admin commands' exit codes and the error that refuses a command."""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0
EXIT_UNREACHABLE: Final = 1
EXIT_BAD_INPUT: Final = 2


class AdminError(Exception):
    """A refused command: its exit code and the message for ``quotastream: error: ...``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def bad(message: str) -> AdminError:
    return AdminError(EXIT_BAD_INPUT, message)
