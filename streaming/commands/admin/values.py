"""Numbers and quota types typed on the command line; each error names the option and value."""

from __future__ import annotations

import math

from state.quota_types import QuotaType
from streaming.commands.admin.errors import bad


def parse_finite(text: str, what: str, unit: str) -> float:
    """A finite float from the command line; the error names the option (or key) and value."""
    try:
        value = float(text)
    except ValueError:
        raise bad(f"{what} {text!r} is not a number{unit}") from None
    if not math.isfinite(value):
        raise bad(f"{what} must be a finite number{unit}, got {text}")
    return value


def optional_number(text: str | None, option: str) -> float | None:
    return None if text is None else parse_finite(text, option, "")


def optional_count(text: str | None, option: str) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise bad(f"{option} {text!r} is not a whole number") from None


def parse_quota_type(text: str) -> QuotaType:
    try:
        return QuotaType(text)
    except ValueError:
        raise bad(
            f"unknown quota type {text!r} (one of {', '.join(q.value for q in QuotaType)})"
        ) from None
