"""The checks every declaration shares. `bool` is an `int` subclass in Python, and
`retries = True` or `ttl: True` is a typo, not the number 1: each check here refuses it."""

from __future__ import annotations

from typing import TypeGuard


def is_int(value: object) -> TypeGuard[int]:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """An int (not a bool) or a float."""
    return is_int(value) or isinstance(value, float)


def int_problem(value: object, *, minimum: int = 1, unit: str = "") -> str | None:
    """None when `value` is an int (not a bool) >= `minimum`, else what is wrong with it, e.g.
    "must be an int >= 1 (ms), got True"."""
    if is_int(value) and value >= minimum:
        return None
    kind = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    return f"must be {kind}{f' ({unit})' if unit else ''}, got {value!r}"
