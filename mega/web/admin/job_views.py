"""What the admin pages show of one job, one workflow and one dead letter (fleet.py has the
lanes, the workers and the schedules): plain dicts and tuples out, for the job, workflow and
dead-letter pages and for an app's own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from mega.jobs.workflow_records import parse_step
from mega.web.admin.fleet import age, ago, clipped, iso_utc, pretty_json, short_instance, utc_time

# A workflow step's result is shown up to this many characters (its job's page has it whole).
STEP_RESULT_CHARS = 120


def dead_letter_view(record: Any) -> dict[str, Any]:
    """A DLQ record as the pages show it: the payload as indented JSON (or the raw body of
    one that was not JSON), the error, the attempts and times, the worker."""
    error = record.get("error") or {}
    worker = record.get("worker") or ""
    raw = record.get("raw_b64")
    payload, payload_cut = clipped(pretty_json(record.get("payload")) if raw is None else "")
    raw_shown, raw_cut = clipped(raw) if raw is not None else (None, False)
    message, message_cut = clipped(str(error.get("message", "")))
    return {
        "id": record["id"],
        "seq": record.get("seq"),
        "payload": None if raw is not None else payload,
        "raw_b64": raw_shown,
        "error_type": error.get("type", "—"),
        "error_message": message,
        # Something was cut for the page: it links to the whole record as JSON.
        "clipped": payload_cut or raw_cut or message_cut,
        "attempts": record.get("attempts"),
        "first_enqueued": utc_time(record.get("first_enqueued_at")),
        "failed_at": utc_time(record.get("failed_at")),
        "failed_iso": iso_utc(record.get("failed_at")),
        "failed_ago": ago(record.get("failed_at")),
        "worker": worker,
        "worker_short": short_instance(worker) if worker else "—",
    }


def took(started_at: int | None, finished_at: int | None) -> str:
    if started_at is None or finished_at is None:
        return "—"
    ms = max(0, finished_at - started_at)
    return f"{ms} ms" if ms < 10_000 else age(ms / 1000)


def status_view(status: Any) -> list[tuple[str, str]]:
    """The job's record as label / value pairs, in the order of its life."""
    rows = [
        ("state", status.state),
        ("attempts", str(status.attempts)),
        ("enqueued", utc_time(status.enqueued_at)),
    ]
    if status.due_at is not None:
        rows.append(("due", utc_time(status.due_at)))
    rows += [
        ("started", utc_time(status.started_at)),
        ("finished", utc_time(status.finished_at)),
        ("worker", status.worker or "—"),
    ]
    if status.error is not None:
        rows.append(("error", f"{status.error.type}: {status.error.message}"))
    return rows


# The error of a dead letter whose last run never reported back (mega/lanes/consumer.py).
CRASHED = "WorkerCrashed"


def attempt_rows(status: Any) -> list[dict[str, Any]]:
    """Every attempt the record knows, oldest first: those before each requeue from the DLQ
    (`before_requeue`, their attempt numbers marked with the time they ran in), the `history`,
    then the latest."""
    rows = []
    attempts = [*status.before_requeue, *status.history]
    if status.attempts and status.state not in ("queued", "delayed"):
        attempts.append(status)
    earlier = len(status.before_requeue)
    for n, item in enumerate(attempts):
        error = item.error
        number = getattr(item, "attempt", None) or item.attempts
        # A run that never reported back took no time we know: its end is when it was found.
        lasted = "—" if error and error.type == CRASHED else took(item.started_at, item.finished_at)
        rows.append(
            {
                "attempt": f"{number} (before a requeue)" if n < earlier else number,
                "state": item.state,
                "worker": item.worker or "",
                "worker_short": short_instance(item.worker) if item.worker else "—",
                "started": utc_time(item.started_at),
                "took": lasted,
                "error": f"{error.type}: {error.message}" if error else "",
            }
        )
    return rows


def cause_view(cause: Any, job_url: str) -> dict[str, Any]:
    """What enqueued a job, as its page says it: the listener group's run of an event, or
    another job's run (whose page `job_url` is)."""
    if cause.kind == "event":
        return {
            "sentence": f"Enqueued by listener group {cause.group} while it ran event {cause.name}",
            "id": cause.id,
            "url": None,
        }
    return {"sentence": f"Enqueued by a run of job {cause.name}", "id": cause.id, "url": job_url}


def workflow_view(status: Any) -> list[tuple[str, str]]:
    """A workflow's summary, as label and text."""
    ended = sum(step.state in ("done", "dlq", "cancelled") for step in status.steps)
    rows = [
        (
            "kind",
            "chain: one step after the other"
            if status.kind == "chain"
            else "group: members at once" + (", then a callback" if status.then else ""),
        ),
        ("steps ended", f"{ended} of {len(status.steps)}"),
        ("created", utc_time(status.created_at)),
    ]
    if status.finished_at:
        rows.append(("finished", utc_time(status.finished_at)))
    return rows


def step_row(step: Any, url: str) -> dict[str, Any]:
    """One step of a workflow: its place, its job's page, its state, what it returned."""
    place = step.id.rsplit("~", 1)[1]
    if step.error is not None:
        outcome = f"{step.error.type}: {step.error.message}"
    elif step.state == "done" and step.result is not None:
        outcome = json.dumps(step.result, separators=(", ", ": "))
        if len(outcome) > STEP_RESULT_CHARS:
            outcome = outcome[: STEP_RESULT_CHARS - 1] + "…"
    else:
        outcome = ""
    return {
        "place": "callback" if place == "then" else str(int(place) + 1),
        "id": step.id,
        "job": step.job,
        "state": step.state,
        "attempts": step.attempts,
        "outcome": outcome,
        "url": None if step.state == "waiting" else url,
    }


def workflow_link(job_id: str, url_of: Callable[[str], str]) -> dict[str, str] | None:
    """The workflow a job is a step of (its id says so), for the job's page."""
    parsed = parse_step(job_id)
    if parsed is None:
        return None
    workflow_id, place = parsed
    where = "the callback" if place == "then" else f"step {int(place) + 1}"
    return {"id": workflow_id, "where": where, "url": url_of(workflow_id)}
