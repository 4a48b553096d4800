"""What ``quotastream replay`` run in-process gives back (the ``replay_cli`` fixture of
``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class ReplayRun:
    exit_code: int
    decisions: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    stderr: str


ReplayRunner = Callable[..., ReplayRun]
