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
