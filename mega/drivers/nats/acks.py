"""Pipelined JetStream publishes whose every answer comes back, error answers included.

`js.publish` waits for one answer per call, with a timer of its own: a batch of them costs far
more than the publishes. nats-py's `publish_async` pipelines, but an error answer (a create
refused because the key exists, 10071) never settles its future: the caller waits out its
timeout. `AckMux` does what both mean to: one reply subscription of its own, each publish
tagged with a token in its reply subject, every answer (a PubAck, an error, the server's "no
responders" status) handed to its future, and one deadline for the whole batch.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Sequence
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from mega.drivers.base import DriverUnavailable
from mega.drivers.nats.errors import NATS_ERRORS

# A publish's subject, body and headers.
Envelope = tuple[str, bytes, dict[str, str] | None]
# Many messages at once: time for every PubAck, on top of this much per message.
BULK_TIMEOUT_S = 5.0
BULK_TIMEOUT_PER_MSG_S = 0.001
# The status header of the server's own answer to a request nobody serves (no such stream).
NO_RESPONDERS = "503"


class AckMux:
    """Publishes onto JetStream and the answers to them, over one NATS connection."""

    def __init__(self, nc: NatsClient) -> None:
        self.nc = nc
        self._inbox = ""
        self._tokens = itertools.count()
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}

    async def publish(self, envelopes: Sequence[Envelope], *, timeout_s: float) -> list[Any]:
        """Send every envelope, in order, then wait (up to `timeout_s` in all) for their
        answers: each a PubAck's fields (a dict) or the error answer's `{"error": ...}`.
        DriverUnavailable when one does not come, or the connection fails."""
        if not self._inbox:
            inbox = self.nc.new_inbox()
            await self.nc.subscribe(f"{inbox}.*", cb=self._answer)
            self._inbox = inbox
        loop = asyncio.get_running_loop()
        tokens: list[str] = []
        futures: list[asyncio.Future[dict[str, Any]]] = []
        try:
            for subject, body, headers in envelopes:
                token = str(next(self._tokens))
                # An answer may come (and leave `_waiting`) before the last one is sent.
                future = self._waiting[token] = loop.create_future()
                tokens.append(token)
                futures.append(future)
                await self.nc.publish(
                    subject, body, reply=f"{self._inbox}.{token}", headers=headers
                )
            # asyncio.timeout, not wait_for: a stop that cancels this task then takes the
            # gather's CancelledError itself (wait_for left it unretrieved, and logged).
            async with asyncio.timeout(timeout_s):
                answers: list[Any] = await asyncio.gather(*futures)
            return answers
        except NATS_ERRORS as exc:
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc
        finally:
            for token, future in zip(tokens, futures, strict=True):
                self._waiting.pop(token, None)
                if not future.done():
                    future.cancel()

    async def _answer(self, msg: Msg) -> None:
        future = self._waiting.pop(msg.subject.rsplit(".", 1)[-1], None)
        if future is None or future.done():
            return  # its batch gave up waiting
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS:
            future.set_exception(DriverUnavailable("no JetStream stream answers that subject"))
            return
        try:
            future.set_result(json.loads(msg.data))
        except ValueError as exc:
            future.set_exception(DriverUnavailable(f"an answer that is not JSON: {exc}"))
