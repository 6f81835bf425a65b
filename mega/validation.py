"""Checks of the values handed to the framework at run time: a progress report, a lock TTL, a
delay. `bool` is an `int` subclass in Python, and `ttl=True` is a typo, not the number 1: each
check here refuses it. Standard library only, since every pool child imports it; the declared
classes (Job, Schedule, ...) are checked by pydantic models (mega/declaration.py)."""

from __future__ import annotations

import math
from typing import TypeGuard


def is_int(value: object) -> TypeGuard[int]:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """An int (not a bool) or a float."""
    return is_int(value) or isinstance(value, float)


# A job's or an event's payload, as JSON, is at most this by default (`max_payload_bytes` on
# the class): a queue carries work, not data (a 30 MiB payload made the dead-letter page weigh
# 42 MB). Store big data elsewhere and pass its key.
MAX_PAYLOAD_BYTES = 1024 * 1024

# Ids and keys given by a caller travel as header values, subjects and keys: bounded so that
# whatever an engine builds of one stays within its limits.
MAX_ID_LENGTH = 200


def is_token(value: object, max_length: int = MAX_ID_LENGTH) -> bool:
    """Whether `value` may be an id or a key: it travels as a header value, so no whitespace
    (a CR/LF would forge headers), and bounded: 1 to `max_length` printable characters.
    (`isprintable` is false for every whitespace but the ASCII space.)"""
    return (
        isinstance(value, str)
        and 0 < len(value) <= max_length
        and value.isprintable()
        and " " not in value
    )


def shortened(value: object, limit: int = 60) -> str:
    """`repr(value)` cut to about `limit` characters, with the length of what was cut: an
    error message names a bad value without repeating 5,000 characters of it."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value):,} characters)" if isinstance(value, str) else ""
    return f"{text[:limit]}...{size}"


def int_problem(value: object, *, minimum: int = 1, unit: str = "") -> str | None:
    """None when `value` is an int (not a bool) >= `minimum`, else what is wrong with it, e.g.
    "must be an int >= 1 (ms), got True"."""
    if is_int(value) and value >= minimum:
        return None
    kind = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    return f"must be {kind}{f' ({unit})' if unit else ''}, got {value!r}"


# A progress note longer than this is cut: it labels a progress bar, it is not a log.
MAX_NOTE_CHARS = 200


def progress_fraction(fraction: object) -> float:
    """A progress report's `fraction` as a float from 0 to 1 (both included); ValueError naming
    it otherwise (NaN, a bool, a string). Jobs and pool tasks report progress the same way."""
    if not is_number(fraction) or math.isnan(fraction) or not 0 <= fraction <= 1:
        raise ValueError(f"progress fraction must be a number from 0 to 1, got {fraction!r}")
    return float(fraction)


def progress_note(note: object) -> str | None:
    """A progress report's `note` as text of at most MAX_NOTE_CHARS (longer is cut), or None;
    ValueError for anything else."""
    if note is None:
        return None
    if not isinstance(note, str):
        raise ValueError(f"progress note must be text or None, got {type(note).__name__}")
    return note[:MAX_NOTE_CHARS]
