"""Every statement of the `postgres` bus driver, as named constants (its tables: schema.py).
Plain strings, no psycopg import, like schema.py.

Statements take psycopg's named parameters (`%(name)s`). The ones that `publish_in` also sends
through SQLAlchemy write their casts as `CAST(... AS type)`, never `::type`, and contain no
other `%`, so `sqlalchemy_text()` can turn them into `:name` parameters.

Times: `run_at`, `leased_until` and the other instants are `timestamptz`, compared with the
server's `now()`. Every worker thus reads leases and due times on one clock (the database's),
whatever the drift of its own, and the claim's `run_at <= now()` is an index range. The
framework's epoch milliseconds (`Message.run_at_ms`, a retry's `due_ms`) are converted at the
boundary with `to_timestamp(ms / 1000.0)`; the caller-given stamps that are only carried
(`enqueued_at_ms`, `emitted_at_ms`) stay bigint epoch ms, as they came.
"""

from __future__ import annotations

import hashlib
import json
import re

from mega.drivers.base import DEDUP_WINDOW_S, PRIORITIES
from mega.drivers.postgres.schema import (
    COUNTER_PREFIX,
    CURSORS,
    DEAD,
    DEDUP,
    EMIT_LOCK_KEY,
    EVENTS,
    JOBS,
    RECORDS,
)

# -- jobs -------------------------------------------------------------------------------------

# Store one job unless its caller-given id was seen on the lane within the window; returns one
# row, `kept`. The dedup key is taken in the same statement (a key whose window has passed is
# renewed, which counts as new); a later statement of the same transaction sees it, so a
# duplicate within one batch is dropped too. Shared with `publish_in` (SQLAlchemy).
PUBLISH = f"""
WITH fresh AS (
    INSERT INTO {DEDUP} (lane, message_id, expires_at)
    SELECT %(lane)s, %(job_id)s, now() + make_interval(secs => {DEDUP_WINDOW_S})
    WHERE %(dedup)s
    ON CONFLICT (lane, message_id) DO UPDATE SET expires_at = EXCLUDED.expires_at
        WHERE {DEDUP}.expires_at <= now()
    RETURNING 1
), stored AS (
    INSERT INTO {JOBS} (lane, job_id, subject, body, enqueued_at_ms, run_at, trace, flow_key,
                        priority)
    SELECT %(lane)s, %(job_id)s, %(subject)s, %(body)s, %(enqueued_at_ms)s,
           coalesce(to_timestamp(CAST(%(run_at_ms)s AS bigint) / 1000.0), now()), %(trace)s,
           %(flow_key)s, %(priority)s
    WHERE NOT %(dedup)s OR EXISTS (SELECT 1 FROM fresh)
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM stored) AS kept
"""

# Wake the receivers of a lane (payload: the lane's name, or EVENTS_PAYLOAD). Sent inside the
# transaction that stored the rows: PostgreSQL delivers it at commit, and never on rollback.
NOTIFY = "SELECT pg_notify(%(channel)s, %(payload)s)"

# The claim: up to `limit` due rows of the lane, oldest due first, that no live worker holds.
# SKIP LOCKED lets concurrent claimers pass each other's rows instead of waiting for them;
# a row locked meanwhile is re-checked against its new version (leased by then: skipped), so
# a row is never handed to two workers at once. The lease is the server's now + ack wait.
# What a claim does to the rows it chose, and answers of each (CLAIM, CLAIM_FAIR).
CLAIMED = f"""
UPDATE {JOBS} AS job
SET leased_until = now() + make_interval(secs => %(ack_wait_s)s),
    deliveries = job.deliveries + 1,
    consumer = %(consumer)s
WHERE job.id = ANY(ARRAY(SELECT id FROM due))
RETURNING job.id, job.job_id, job.subject, job.body, job.attempts, job.deliveries,
          job.enqueued_at_ms, (extract(epoch FROM job.run_at) * 1000)::bigint AS run_at_ms,
          job.trace, job.flow_key
"""

CLAIM = (
    f"""
WITH due AS (
    SELECT id FROM {JOBS}
    WHERE lane = %(lane)s AND run_at <= now()
      AND (leased_until IS NULL OR leased_until <= now())
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
"""
    + CLAIMED
)

# The claim of a fair lane: the keys take turns. The claim walks the lane's keys in the key
# index (KEY_INDEX_DDL), one index probe per key, from the key after the receiver's last turn
# (`after`) round to it, at most `limit` keys; each key offers its oldest due rows (a share of
# `limit`: the claim is right when a key has fewer and the next claim goes on), ranked; rows are
# taken by rank, then in the walk's order: the oldest row of every key walked, then the second
# of each, and so on. So a claim reads the keys and their heads, never every row waiting: a key
# with a million rows costs what a key with a few does. Those still free are locked (SKIP LOCKED,
# as in CLAIM) in that order: a claimer racing another for the same heads takes the next ones.
CLAIM_FAIR = (
    f"""
WITH RECURSIVE after_last AS (
    (SELECT flow_key, 1 AS place FROM {JOBS}
     WHERE lane = %(lane)s AND flow_key > %(after)s ORDER BY flow_key LIMIT 1)
    UNION ALL
    SELECT (SELECT job.flow_key FROM {JOBS} AS job
            WHERE job.lane = %(lane)s AND job.flow_key > walk.flow_key
            ORDER BY job.flow_key LIMIT 1),
           walk.place + 1
    FROM after_last AS walk WHERE walk.flow_key IS NOT NULL AND walk.place < %(limit)s
), round_to_last AS (
    (SELECT flow_key, 1 AS place FROM {JOBS}
     WHERE lane = %(lane)s AND flow_key >= '' AND flow_key <= %(after)s
     ORDER BY flow_key LIMIT 1)
    UNION ALL
    SELECT (SELECT job.flow_key FROM {JOBS} AS job
            WHERE job.lane = %(lane)s AND job.flow_key > walk.flow_key
              AND job.flow_key <= %(after)s
            ORDER BY job.flow_key LIMIT 1),
           walk.place + 1
    FROM round_to_last AS walk WHERE walk.flow_key IS NOT NULL AND walk.place < %(limit)s
), walked AS (
    SELECT flow_key, place FROM after_last WHERE flow_key IS NOT NULL
    UNION ALL
    SELECT flow_key, %(limit)s + place FROM round_to_last WHERE flow_key IS NOT NULL
), keys AS (
    SELECT flow_key, place FROM walked ORDER BY place LIMIT %(limit)s
), candidates AS (
    SELECT offered.id, offered.turn, keys.place FROM keys CROSS JOIN LATERAL (
        SELECT id, row_number() OVER (ORDER BY run_at, id) AS turn FROM (
            SELECT id, run_at FROM {JOBS}
            WHERE lane = %(lane)s AND flow_key = keys.flow_key AND run_at <= now()
              AND (leased_until IS NULL OR leased_until <= now())
            ORDER BY run_at, id
            LIMIT (SELECT %(limit)s / count(*) + 1 FROM keys)
        ) AS oldest
    ) AS offered
), due AS (
    SELECT job.id FROM {JOBS} AS job JOIN candidates USING (id)
    WHERE job.id = ANY(ARRAY(SELECT id FROM candidates))
      AND (job.leased_until IS NULL OR job.leased_until <= now())
    ORDER BY candidates.turn, candidates.place
    LIMIT %(limit)s
    FOR UPDATE OF job SKIP LOCKED
)
"""
    + CLAIMED
)

# The claim of a prioritized lane: the bands take turns. The receiver deals the claim's turns
# (PRIORITY_TURNS, from where its last claim stopped) into a quota per band. Each band offers
# its oldest due rows, up to `limit` (the band index), ranked; the rows within their band's
# quota go first, then the others, highest band first: a turn whose band has no row goes to
# the highest band that has one. Locked as in CLAIM_FAIR.
_BAND = f"""
    SELECT id, %(band)s AS band, row_number() OVER (ORDER BY run_at, id) AS rank FROM (
        SELECT id, run_at FROM {JOBS}
        WHERE lane = %(lane)s AND priority = '%(name)s' AND run_at <= now()
          AND (leased_until IS NULL OR leased_until <= now())
        ORDER BY run_at, id LIMIT %(limit)s
    ) AS offered"""
CLAIM_PRIORITY = (
    "WITH candidates AS ("
    + "\n    UNION ALL".join(
        f"({_BAND.replace('%(band)s', str(band)).replace('%(name)s', name)}\n)"
        for band, name in enumerate(PRIORITIES)
    )
    + f"""
), due AS (
    SELECT job.id FROM {JOBS} AS job JOIN candidates USING (id)
    WHERE job.leased_until IS NULL OR job.leased_until <= now()
    ORDER BY candidates.rank > (%(quotas)s::int[])[candidates.band + 1], candidates.band,
             candidates.rank
    LIMIT %(limit)s
    FOR UPDATE OF job SKIP LOCKED
)
"""
    + CLAIMED
)

# Seconds until the lane's next not-yet-due row is due (NULL: none), to end a fetch's wait
# then rather than at the next poll.
NEXT_DUE = f"""
SELECT extract(epoch FROM min(run_at) - now())::float8 FROM {JOBS}
WHERE lane = %(lane)s AND run_at > now() AND leased_until IS NULL
"""

# Settle: done. Many at once (acks are batched).
ACK = f"DELETE FROM {JOBS} WHERE id = ANY(%(ids)s)"

# Still running: push the lease back. Only while this delivery is the row's latest claim
# (`deliveries` unchanged): a worker whose lease ran out and was taken over cannot take it back.
EXTEND = f"""
UPDATE {JOBS} SET leased_until = now() + make_interval(secs => %(ack_wait_s)s)
WHERE id = %(id)s AND deliveries = %(deliveries)s
"""

# Run again at `due_ms` as attempt `attempts + 1`: the lease is cleared (no slot held while it
# waits) and the deliveries start again from 0 on top of the attempts made.
RETRY = f"""
UPDATE {JOBS}
SET run_at = to_timestamp(%(due_ms)s / 1000.0), attempts = %(attempts)s, deliveries = 0,
    leased_until = NULL, consumer = NULL, trace = %(trace)s
WHERE id = %(id)s AND deliveries = %(deliveries)s
"""

# Hand back unsettled, claimable by anyone after `delay_s`; the deliveries count stays (the
# next claim is the next attempt, as when a lease runs out).
RELEASE = f"""
UPDATE {JOBS}
SET run_at = now() + make_interval(secs => %(delay_s)s), leased_until = NULL, consumer = NULL
WHERE id = %(id)s AND deliveries = %(deliveries)s
"""

# Store the record and delete the row: one statement, so one transaction.
DEAD_LETTER = f"""
WITH gone AS (DELETE FROM {JOBS} WHERE id = %(id)s)
INSERT INTO {DEAD} (lane, record) VALUES (%(lane)s, %(record)s)
"""

# The lane now: claimable or waiting vs leased, and its dead letters; the first enqueue of
# its rows that are due or leased (a delayed job or a retry not due yet left out), in the same
# pass over the lane's rows; and its counter (`COUNTER_DDL`, 0 when it has none).
STATS = f"""
SELECT count(*) FILTER (WHERE leased_until IS NULL OR leased_until <= now()),
       count(*) FILTER (WHERE leased_until > now()),
       (SELECT count(*) FROM {DEAD} WHERE lane = %(lane)s),
       min(enqueued_at_ms) FILTER (WHERE run_at <= now() OR leased_until IS NOT NULL),
       (SELECT coalesce(pg_sequence_last_value(to_regclass(%(counter)s)), 0))
FROM {JOBS} WHERE lane = %(lane)s
"""
# Counting a lane's rows reads every one of them (a million rows: 150 ms of the server's time),
# and a worker's metrics read its queue's stats every second. So a lane with more than
# STATS_EXACT_ROWS rows is counted by estimate: LANE_ROWS tells which, reading at most that
# many index entries; STATS_HEAD reads the claim index's head for what is leased and the
# oldest due row; ROWS_ESTIMATE asks the planner how many rows the lane has (its statistics,
# which autovacuum's ANALYZE keeps within about a tenth on a table that changes).
STATS_EXACT_ROWS = 10_000
LANE_ROWS = f"""
SELECT count(*) FROM (SELECT 1 FROM {JOBS} WHERE lane = %(lane)s LIMIT %(cap)s) AS capped
"""
STATS_HEAD = f"""
SELECT count(*) FILTER (WHERE leased_until > now()),
       (SELECT count(*) FROM {DEAD} WHERE lane = %(lane)s),
       min(enqueued_at_ms) FILTER (WHERE run_at <= now() OR leased_until IS NOT NULL),
       (SELECT coalesce(pg_sequence_last_value(to_regclass(%(counter)s)), 0))
FROM (SELECT leased_until, run_at, enqueued_at_ms FROM {JOBS}
      WHERE lane = %(lane)s ORDER BY run_at, id LIMIT %(cap)s) AS head
"""
ROWS_ESTIMATE = f"EXPLAIN (FORMAT JSON) SELECT 1 FROM {JOBS} WHERE lane = %(lane)s"

# A lane's counter, where missing (in `ensure`, under its DDL lock).
COUNTER_CREATE = "CREATE SEQUENCE IF NOT EXISTS {name}"

# -- dead letters -----------------------------------------------------------------------------

# A page, newest first: a range read of the (lane, seq) index, from `before` (exclusive) down.
DEAD_LIST = f"""
SELECT seq, record FROM {DEAD} WHERE lane = %(lane)s AND seq < %(before)s
ORDER BY seq DESC LIMIT %(limit)s
"""
# The newest record of a job id: the (lane, id) index (DEAD_INDEX_DDL).
DEAD_GET = f"""
SELECT seq, record FROM {DEAD} WHERE lane = %(lane)s AND record->>'id' = %(job_id)s
ORDER BY seq DESC LIMIT 1
"""
DEAD_DELETE = f"DELETE FROM {DEAD} WHERE lane = %(lane)s AND seq = %(seq)s"
DEAD_COUNT = f"SELECT count(*) FROM {DEAD} WHERE lane = %(lane)s"
# Requeue, step 1 (in the transaction of step 2): take the record out; no row, nothing to do.
DEAD_TAKE = f"DELETE FROM {DEAD} WHERE lane = %(lane)s AND seq = %(seq)s RETURNING seq"
# Requeue, step 2: the record's job as a new row, attempts starting again at 0 (+1 delivery).
REQUEUE = f"""
INSERT INTO {JOBS} (lane, job_id, subject, body, enqueued_at_ms, flow_key, priority)
VALUES (%(lane)s, %(job_id)s, %(subject)s, %(body)s, %(enqueued_at_ms)s, %(flow_key)s,
        %(priority)s)
"""
DEAD_PURGE = f"DELETE FROM {DEAD} WHERE lane = %(lane)s"

# -- events -----------------------------------------------------------------------------------

# Taken first by every emit, held until its commit: events then commit in the order of their
# seq, so a group's cursor that passed seq N can never meet a later-committed event below N.
EMIT_LOCK = f"SELECT pg_advisory_xact_lock({EMIT_LOCK_KEY})"

# Append one event unless its id is kept already; a row back: it was kept.
EMIT = f"""
INSERT INTO {EVENTS} (event_id, name, body, emitted_at_ms, trace)
VALUES (%(event_id)s, %(name)s, %(body)s, %(emitted_at_ms)s, %(trace)s)
ON CONFLICT (event_id) DO NOTHING
RETURNING seq
"""

# A new group starts before every event kept (seq are > 0): it replays them. Racing ensures
# of one group keep the first cursor.
CURSOR_CREATE = f"""
INSERT INTO {CURSORS} (lane, last_seq) VALUES (%(lane)s, 0) ON CONFLICT (lane) DO NOTHING
"""

# Copy, step 1: lock the group's cursor for this transaction. SKIP LOCKED: when a process of
# the group is copying right now, the others need not queue behind it (it copies for all).
CURSOR_LOCK = f"SELECT last_seq FROM {CURSORS} WHERE lane = %(lane)s FOR UPDATE SKIP LOCKED"

# Copy, step 2 (a fresh snapshot, taken after the lock): the next events past the cursor, the
# matching ones into the group's lane as job rows, and the cursor moved past all of them.
# Returns how many were copied and how many read.
COPY_EVENTS = f"""
WITH batch AS (
    SELECT seq, event_id, name, body, emitted_at_ms, trace FROM {EVENTS}
    WHERE seq > %(last_seq)s ORDER BY seq LIMIT %(limit)s
), copied AS (
    INSERT INTO {JOBS} (lane, job_id, subject, body, enqueued_at_ms, trace)
    SELECT %(lane)s, event_id, name, body, emitted_at_ms, trace FROM batch
    WHERE name ~ %(pattern)s ORDER BY seq
    RETURNING 1
), moved AS (
    UPDATE {CURSORS} SET last_seq = (SELECT max(seq) FROM batch)
    WHERE lane = %(lane)s AND EXISTS (SELECT 1 FROM batch)
)
SELECT (SELECT count(*) FROM copied), (SELECT count(*) FROM batch)
"""

# Events past a group's cursor that it will copy: counted as pending by `stats`, with the
# first one's emit time.
UNCOPIED = f"""
SELECT count(*), min(emitted_at_ms) FROM {EVENTS}
WHERE seq > (SELECT last_seq FROM {CURSORS} WHERE lane = %(lane)s) AND name ~ %(pattern)s
"""

# -- records ----------------------------------------------------------------------------------

# Write a batch of records (distinct keys: one row may change once per statement), each kept
# `keep_s` from now: one statement however many, the rows locked in key order. Overwrite:
# whatever each key had. The arrays go in binary (%b): psycopg escapes each element of a text
# array with a regular expression, a tenth of a worker's time on PostgreSQL.
RECORDS_PUT = f"""
INSERT INTO {RECORDS} AS old (lane, tbl, key, value, expires_at)
SELECT %(lane)s, %(tbl)s, r.key, r.value, now() + make_interval(secs => %(keep_s)s)
FROM unnest(%(keys)b::text[], %(values)b::bytea[]) AS r(key, value)
ORDER BY r.key
ON CONFLICT (lane, tbl, key) DO UPDATE
    SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
"""
# Create: the same, each only over no row or an expired one; the keys stored come back. A
# racing create of a key waits for the first one's commit, then sees its row live and stores
# nothing.
RECORDS_CREATE = (
    RECORDS_PUT
    + """    WHERE old.expires_at <= now()
RETURNING key
"""
)
RECORDS_GET = f"""
SELECT key, value FROM {RECORDS}
WHERE lane = %(lane)s AND tbl = %(tbl)s AND key = ANY(%(keys)s) AND expires_at > now()
"""
# Every live record of a table (the small "workers" one): a range of the primary key.
RECORDS_LIST = f"""
SELECT key, value FROM {RECORDS}
WHERE lane = %(lane)s AND tbl = %(tbl)s AND expires_at > now()
"""

# -- pruning (from time to time, by receivers) ------------------------------------------------

PRUNE_DEDUP = f"DELETE FROM {DEDUP} WHERE expires_at <= now()"
PRUNE_RECORDS = f"DELETE FROM {RECORDS} WHERE expires_at <= now()"
PRUNE_DEAD = f"""
DELETE FROM {DEAD} WHERE lane = %(lane)s AND failed_at < now() - make_interval(secs => %(age_s)s)
"""
PRUNE_EVENTS = f"""
DELETE FROM {EVENTS} WHERE stored_at < now() - make_interval(secs => %(age_s)s)
"""


def pattern_regex(pattern: str) -> str:
    """A PostgreSQL regular expression for an event pattern: tokens split on dots, `*` one
    token, `>` (last) one or more. Python's escapes of the literal tokens are ones PostgreSQL's
    advanced regular expressions read the same way (a backslash before a non-alphanumeric)."""
    parts = [
        "[^.]+" if token == "*" else ".+" if token == ">" else re.escape(token)
        for token in pattern.split(".")
    ]
    return "^" + r"\.".join(parts) + "$"


def counter_of(lane_key: str) -> str:
    """The name of a lane's counter sequence (as the trigger finds it: md5 of the lane key)."""
    return COUNTER_PREFIX + hashlib.md5(lane_key.encode(), usedforsecurity=False).hexdigest()


def sqlalchemy_text(statement: str) -> str:
    """The statement with SQLAlchemy's `:name` parameters instead of psycopg's `%(name)s`."""
    return re.sub(r"%\((\w+)\)s", r":\1", statement)


def trace_text(trace: dict[str, str] | None) -> str | None:
    """A message's trace context headers as the `trace` column holds them (JSON, or NULL)."""
    return json.dumps(trace) if trace else None
