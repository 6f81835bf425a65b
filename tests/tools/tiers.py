"""A pytest plugin for tests/tools/test_tiers.py: at the end of a collection, each item's node id
on a line of its own, after KEPT when `make check` runs it and LEFT when it is marked `server`
(tests/conftest.py marks them while collecting)."""

from __future__ import annotations

import pytest

KEPT = "tier:check "
LEFT = "tier:test "


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        print((LEFT if item.get_closest_marker("server") else KEPT) + item.nodeid)
