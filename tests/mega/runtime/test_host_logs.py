"""The hosts' signal log lines: one line per signal whatever the user text in it (no forged
lines, no hidden characters), plain values left as they are."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from mega.runtime.hosts import _observe
from mega.signals import Signals


class Runtime:
    def __init__(self) -> None:
        self.signals = Signals({"fail", "done"})

    def on(self, name: str, observer: Any) -> None:
        self.signals.on(name, observer)


async def test_user_text_cannot_forge_or_hide_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    runtime = Runtime()
    _observe(runtime, ("fail", "done"))
    forged = "bad\n23:59:59 INFO     mega.signals: done job=EmailJob id=FORGED0001"
    with caplog.at_level(logging.INFO, logger="mega.signals"):
        await runtime.signals.emit("fail", job="EmailJob", id="j1", error=forged, to="a\u202eb")
        await runtime.signals.emit("done", job="EmailJob", id="j2", attempt=1)
    lines = caplog.text.splitlines()
    assert len(lines) == 2  # one per signal: the newline did not start a line
    assert (
        'error="bad\\n23:59:59 INFO     mega.signals: done job=EmailJob id=FORGED0001"' in lines[0]
    )
    assert 'to="a\\u202eb"' in lines[0]  # the bidi override shows as an escape
    assert lines[1].endswith("done job=EmailJob id=j2 attempt=1")  # plain values unchanged
