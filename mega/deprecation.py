"""Old spellings that still work, each warning once per process with the new one to use.
CHANGELOG.md lists them, with the release that removes them."""

from __future__ import annotations

import warnings

# The release that removes the spellings deprecated now.
REMOVAL = "0.3"
_warned: set[str] = set()


def deprecated(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn, once per process, that `old` is deprecated for `new` (a DeprecationWarning that
    points at the caller's line)."""
    if old in _warned:
        return
    _warned.add(old)
    warnings.warn(
        f"{old} is deprecated and goes in mega {REMOVAL}: use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
