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

from mega import clock, tracing

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
) -> SignalLog:
    """Log `runtime`'s signals `names` (see SignalLog); the log, whose `every()` a host runs to
    say the summary of what its runtime counts itself."""
    return SignalLog(runtime, names, routine=routine, worker=worker)


class SignalLog:
    """One log line per signal, `key=value` fields (job id, attempt, tick, instance): the host's
    live trace. Failures are WARNING, the rest INFO, but `routine` signals (a worker's `start`
    and `done`, thousands a second under load) are DEBUG, with one INFO line counting them
    every SUMMARY_EVERY_S. Nothing is formatted for a level that is off. The JSON logs have
    the fields as keys of their own (`fields` of the record), with `worker` (this host).

    A routine signal that the runtime counts itself (`runtime.tallied`: a job or listener
    runner's `start` and `done`, which its consume loops count) is not observed at all unless
    its DEBUG lines are on: building and sending two signals a job cost a no-op job a quarter
    of its time (bench/bench_budget.py). The summary then reads `runtime.tally()`, at the next
    routine signal or at `every()`'s next turn."""

    def __init__(
        self, runtime: Any, names: tuple[str, ...], *, routine: tuple[str, ...], worker: str
    ) -> None:
        self.trace = logging.getLogger("mega.signals")
        self.runtime = runtime
        self.routine = routine
        self.worker = worker
        counts_itself = () if self.trace.isEnabledFor(logging.DEBUG) else runtime_tallied(runtime)
        self.tallied = tuple(name for name in routine if name in counts_itself)
        self.tally: dict[str, int] = dict.fromkeys(routine, 0)
        self.read = self._read_tallies()  # the runtime's counts at the last summary
        self.window_start = clock.monotonic()
        for name in names:
            if name not in self.tallied:
                runtime.on(name, self.log)

    def log(self, signal: dict[str, Any]) -> None:
        name = signal["signal"]
        if name in self.tally:
            self.tally[name] += 1
            self.summarise()
        level = self.level_of(name, signal)
        if self.trace.isEnabledFor(level):
            pairs = (
                f"{k}={_field(v)}" for k, v in signal.items() if k != "signal" and v is not None
            )
            fields = {"worker": self.worker, **signal}
            self.trace.log(level, "%s %s", name, " ".join(pairs), extra={"fields": fields})

    def level_of(self, name: str, signal: dict[str, Any]) -> int:
        # A skip is routine (a peer won the tick) unless the lock backend failed.
        reason = signal.get("reason")
        if name in ("fail", "dlq") or (reason is not None and "error" in str(reason)):
            return logging.WARNING
        return logging.DEBUG if name in self.routine else logging.INFO

    def summarise(self) -> None:
        """The INFO line of the routine counts, once SUMMARY_EVERY_S has passed since the last
        one and something was counted."""
        now = clock.monotonic()
        if now - self.window_start < SUMMARY_EVERY_S:
            return
        read = self._read_tallies()
        for name, count in read.items():
            self.tally[name] += max(0, count - self.read[name])  # a stopped loop's are gone
        self.read = read
        if any(self.tally.values()):
            counts = " ".join(f"{key}={value}" for key, value in self.tally.items())
            self.trace.info("last %.0f s: %s", now - self.window_start, counts)
        self.tally.update(dict.fromkeys(self.tally, 0))
        self.window_start = now

    async def every(self) -> None:
        """Say the summary every SUMMARY_EVERY_S (what the runtime counts sends no signal to
        say it), until cancelled."""
        while True:
            await clock.sleep(SUMMARY_EVERY_S)
            self.summarise()

    def _read_tallies(self) -> dict[str, int]:
        if not self.tallied:
            return {}
        counts = self.runtime.tally()
        return {name: counts[name] for name in self.tallied}


def runtime_tallied(runtime: Any) -> tuple[str, ...]:
    """The signals a runtime counts itself (`tallied`, read with `tally()`), none by default."""
    return tuple(getattr(runtime, "tallied", ()))


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
