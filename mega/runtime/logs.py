"""Logging for the hosts: one readable line per event, or one JSON object per line in production
(`--json-logs` or MEGA_LOG_FORMAT=json). MEGA_LOG_LEVEL sets the level (default INFO)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any

from mega import tracing

# Routine signals (jobs started and done) are counted and logged once per this many seconds.
SUMMARY_EVERY_S = 10.0
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
# The time of a text line: UTC, said with its `Z`, as every page and JSON line says it (a host's
# local time without a zone read as UTC beside them).
TEXT_TIME = "%H:%M:%SZ"


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT, its time in UTC."""

    converter = staticmethod(time.gmtime)  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT, datefmt=TEXT_TIME)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: `ts`, `level`, `logger`, `message`; a signal's fields as keys
    of their own (`signal`, `job`, `id`, `attempt`, `worker`, `duration_ms`...: a record's
    `fields`, none of which replaces those four); `trace_id` and `span_id` when it was logged
    inside a span; `exc` with the traceback of an exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                if value is not None and value != "":
                    entry.setdefault(key, value)
        ids = tracing.ids()
        if ids is not None:
            entry["trace_id"], entry["span_id"] = ids
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(*, json_logs: bool = False) -> None:
    json_logs = json_logs or os.environ.get("MEGA_LOG_FORMAT") == "json"
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(os.environ.get("MEGA_LOG_LEVEL", "INFO").upper())
    # uvicorn.error repeats the host's own start/stop lines at INFO, alembic narrates each step
    # of a migration (the host logs one line for the upgrade); keep their warnings.
    for noisy in ("nats", "uvicorn.access", "uvicorn.error", "httpx", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("nats").setLevel(logging.CRITICAL)  # reconnect noise; boot logs it once


def observe_signals(
    runtime: Any, names: tuple[str, ...], *, routine: tuple[str, ...] = (), worker: str = ""
) -> None:
    """One log line per signal, `key=value` fields (job id, attempt, tick, instance): the host's
    live trace. Failures are WARNING, the rest INFO, but `routine` signals (a worker's `start`
    and `done`, thousands a second under load) are DEBUG, with one INFO line counting them
    every SUMMARY_EVERY_S. Nothing is formatted for a level that is off. The JSON logs have
    the fields as keys of their own (`fields` of the record), with `worker` (this host)."""
    trace = logging.getLogger("mega.signals")
    tally: dict[str, int] = dict.fromkeys(routine, 0)
    window_start = time.monotonic()

    def level_of(name: str, signal: dict[str, Any]) -> int:
        # A skip is routine (a peer won the tick) unless the lock backend failed.
        reason = signal.get("reason")
        if name in ("fail", "dlq") or (reason is not None and "error" in str(reason)):
            return logging.WARNING
        return logging.DEBUG if name in routine else logging.INFO

    def summarise(name: str) -> None:
        nonlocal window_start
        tally[name] += 1
        now = time.monotonic()
        if now - window_start >= SUMMARY_EVERY_S:
            counts = " ".join(f"{key}={value}" for key, value in tally.items())
            trace.info("last %.0f s: %s", now - window_start, counts)
            tally.update(dict.fromkeys(tally, 0))
            window_start = now

    def log(signal: dict[str, Any]) -> None:
        name = signal["signal"]
        if name in tally:
            summarise(name)
        level = level_of(name, signal)
        if trace.isEnabledFor(level):
            pairs = (
                f"{k}={_field(v)}" for k, v in signal.items() if k != "signal" and v is not None
            )
            fields = {"worker": worker, **signal}
            trace.log(level, "%s %s", signal["signal"], " ".join(pairs), extra={"fields": fields})

    for name in names:
        runtime.on(name, log)


def _field(value: Any) -> str:
    """A log field's value: as is when plain, else quoted with quotes, backslashes and every
    unprintable character (CR, LF, NUL, bidi overrides...) escaped, so user text (an e-mail, an
    error message) can never forge a line of its own or hide what it says."""
    text = str(value)
    if text and all(ch.isprintable() and ch not in _SPECIAL for ch in text):
        return text
    escaped = (_ESCAPES.get(ch) or (ch if ch.isprintable() else f"\\u{ord(ch):04x}") for ch in text)
    return '"' + "".join(escaped) + '"'


_SPECIAL = frozenset(' "=\\')
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
