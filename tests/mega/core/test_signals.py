"""The closed signal sets every runtime exposes."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from mega.signals import Signals


async def test_sync_and_async_observers_get_every_field_in_order() -> None:
    events = Signals({"done", "fail"})
    seen: list[tuple[str, dict[str, Any]]] = []

    def sync_observer(event: dict[str, Any]) -> None:
        seen.append(("sync", event))

    async def async_observer(event: dict[str, Any]) -> None:
        seen.append(("async", event))

    events.on("done", sync_observer)
    events.on("done", async_observer)
    await events.emit("done", job="EmailJob", attempt=1)
    assert seen == [
        ("sync", {"signal": "done", "job": "EmailJob", "attempt": 1}),
        ("async", {"signal": "done", "job": "EmailJob", "attempt": 1}),
    ]


@pytest.mark.parametrize("method", ["on", "off"])
def test_unknown_event_names_raise_at_once(method: str) -> None:
    events = Signals({"run", "skip"})
    with pytest.raises(ValueError, match=r"unknown signal 'sikp'; this runtime sends: run, skip"):
        getattr(events, method)("sikp", print)


async def test_emitting_an_unknown_name_is_a_bug_too() -> None:
    with pytest.raises(ValueError, match="unknown signal"):
        await Signals({"run"}).emit("ran")


async def test_a_raising_observer_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events = Signals({"done"})
    seen: list[str] = []

    def broken(event: dict[str, Any]) -> None:
        raise RuntimeError("observer bug")

    events.on("done", broken)
    events.on("done", lambda event: seen.append("after"))
    with caplog.at_level(logging.ERROR, logger="mega.signals"):
        await events.emit("done")
    assert seen == ["after"]
    assert "observer" in caplog.text and "observer bug" in caplog.text


async def test_unsubscribe_stops_delivery() -> None:
    events = Signals({"done"})
    seen: list[dict[str, Any]] = []
    unsubscribe = events.on("done", seen.append)
    assert events.has_observers("done")
    unsubscribe()
    await events.emit("done")
    assert seen == [] and not events.has_observers("done")
