"""Examples under every command's ``--help``: a user learns a command from one line that works."""

from __future__ import annotations

import argparse
from typing import Any

_HEADING = "examples:\n"


class _Formatter(argparse.HelpFormatter):
    """Wraps descriptions as argparse does, and keeps example lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith(_HEADING):
            return text
        return super()._fill_text(text, width, indent)


def examples(*command_lines: str) -> dict[str, Any]:
    """``add_parser`` keywords that end the command's help with ``command_lines``."""
    lines = "\n".join(f"  {line}" for line in command_lines)
    return {"epilog": _HEADING + lines, "formatter_class": _Formatter}
