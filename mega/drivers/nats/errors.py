"""What the nats driver treats as "NATS is not answering right now"."""

from __future__ import annotations

import asyncio

import nats.errors

# Errors that mean "NATS is not answering right now" rather than "this request is wrong".
NATS_ERRORS = (nats.errors.Error, asyncio.TimeoutError, OSError)
