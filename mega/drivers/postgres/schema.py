"""Every table of the `postgres` bus driver, and the DDL that makes them, as named constants
(the statements that use them are in sql.py).

Plain strings, no psycopg import: the framework's migrations 0003, 0006, 0007 and 0008 read the
DDL from here too, on a database that may be SQLite with no psycopg installed. So the tables
have one definition, applied by `mega db upgrade` or, when nobody migrated the database, by
`PostgresBus.ensure` (`SCHEMA`: both).
"""

from __future__ import annotations

JOBS = "mega_bus_jobs"
DEAD = "mega_bus_dead"
DEDUP = "mega_bus_dedup"
EVENTS = "mega_bus_events"
CURSORS = "mega_bus_cursors"
RECORDS = "mega_bus_records"

# NOTIFY channels. One channel for every lane, the payload naming the lane (or EVENTS_PAYLOAD
# for an emit): a channel name is an identifier of at most 63 bytes, a lane name is not
# bounded, and one LISTEN per connection is enough for any number of lanes.
WAKE_CHANNEL = "mega_bus"
EVENTS_PAYLOAD = "*events"  # no lane is called that: lanes are 'job:...' or 'group:...'
OUTBOX_CHANNEL = "mega_outbox_wake"

# pg_advisory_xact_lock key held by every emit until its commit: "mgev" in ASCII.
EMIT_LOCK_KEY = 0x6D676576

DDL: tuple[str, ...] = (
    # One row per job waiting or running, and per event copied to a listener group. `lane` is
    # 'job:<subject>' or 'group:<name>'. `attempts`: attempts made before this row (a retry
    # keeps the count), `deliveries`: claims of this row; a delivery's attempt is their sum.
    # A row is claimable when due and not leased (or its lease ran out: its worker died).
    f"""CREATE TABLE IF NOT EXISTS {JOBS} (
        id bigserial PRIMARY KEY,
        lane text NOT NULL,
        job_id text NOT NULL,
        subject text NOT NULL,
        body bytea NOT NULL,
        enqueued_at_ms bigint,
        run_at timestamptz NOT NULL DEFAULT now(),
        attempts integer NOT NULL DEFAULT 0,
        deliveries integer NOT NULL DEFAULT 0,
        leased_until timestamptz,
        consumer text
    )""",
    # The claim's range scan: a lane's rows in the order they are claimed.
    f"CREATE INDEX IF NOT EXISTS {JOBS}_claim ON {JOBS} (lane, run_at, id)",
    # Dead letters: the record (the same JSON on every driver), `seq` listed newest first.
    f"""CREATE TABLE IF NOT EXISTS {DEAD} (
        seq bigserial PRIMARY KEY,
        lane text NOT NULL,
        record jsonb NOT NULL,
        failed_at timestamptz NOT NULL DEFAULT now()
    )""",
    f"CREATE INDEX IF NOT EXISTS {DEAD}_lane ON {DEAD} (lane, seq)",
    # Caller-given job ids seen within the dedup window. The window is enforced when a job is
    # published (a key past `expires_at` is taken over as new), so pruning expired keys only
    # saves space and may run late.
    f"""CREATE TABLE IF NOT EXISTS {DEDUP} (
        lane text NOT NULL,
        message_id text NOT NULL,
        expires_at timestamptz NOT NULL,
        PRIMARY KEY (lane, message_id)
    )""",
    f"CREATE INDEX IF NOT EXISTS {DEDUP}_expires ON {DEDUP} (expires_at)",
    # The events log, append-only; an event id is kept once (while the event is kept).
    f"""CREATE TABLE IF NOT EXISTS {EVENTS} (
        seq bigserial PRIMARY KEY,
        event_id text NOT NULL UNIQUE,
        name text NOT NULL,
        body bytea NOT NULL,
        emitted_at_ms bigint NOT NULL,
        stored_at timestamptz NOT NULL DEFAULT now()
    )""",
    f"CREATE INDEX IF NOT EXISTS {EVENTS}_stored_at ON {EVENTS} (stored_at)",
    # One row per listener group: the last event seq it copied into its lane.
    f"""CREATE TABLE IF NOT EXISTS {CURSORS} (
        lane text PRIMARY KEY,
        last_seq bigint NOT NULL
    )""",
)

# The tables, children first, for the migration's downgrade.
TABLES = (JOBS, DEAD, DEDUP, EVENTS, CURSORS)

# The lanes' records (`Bus.put_records`), one row per (lane, table, key): made later than the
# others (migration 0006), so `DDL` stays what migration 0003 makes. A row past `expires_at`
# is no record (reads and creates compare with now()); receivers delete such rows now and then.
RECORDS_DDL: tuple[str, ...] = (
    f"""CREATE TABLE IF NOT EXISTS {RECORDS} (
        lane text NOT NULL,
        tbl text NOT NULL,
        key text NOT NULL,
        value bytea NOT NULL,
        expires_at timestamptz NOT NULL,
        PRIMARY KEY (lane, tbl, key)
    )""",
    f"CREATE INDEX IF NOT EXISTS {RECORDS}_expires ON {RECORDS} (expires_at)",
)

# Columns added later (migration 0007) to the tables above: the trace context headers a job
# row or an event carries (JSON text; NULL without tracing), and the key a job was enqueued
# with (NULL: none) and its band on a prioritized lane (NULL: not such a lane).
# Only where missing: ALTER TABLE takes an exclusive lock even when the column exists, and an
# ensure that asked for one while a worker claimed rows deadlocked with that worker.
ADDED_COLUMNS = ((JOBS, "trace"), (EVENTS, "trace"), (JOBS, "flow_key"), (JOBS, "priority"))
ADDED_COLUMNS_DDL: tuple[str, ...] = tuple(
    f"""DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                       WHERE table_schema = current_schema() AND table_name = '{table}'
                         AND column_name = '{column}') THEN
            ALTER TABLE {table} ADD COLUMN {column} text;
        END IF;
    END $$"""
    for table, column in ADDED_COLUMNS
)
# The dead letters by job id (`Bus.dead_letter`), made later than the table (migration 0007).
DEAD_INDEX_DDL: tuple[str, ...] = (
    f"CREATE INDEX IF NOT EXISTS {DEAD}_job ON {DEAD} (lane, (record->>'id'), seq)",
)
# A prioritized lane's rows by band (CLAIM_PRIORITY), made with its column (migration 0007).
BAND_INDEX_DDL: tuple[str, ...] = (
    f"""CREATE INDEX IF NOT EXISTS {JOBS}_band ON {JOBS} (lane, priority, run_at, id)
        WHERE priority IS NOT NULL""",
)

# The keyed rows by key (CLAIM_FAIR walks a fair lane's keys in it, then takes each key's
# oldest), made by migration 0008. Partial: only a job enqueued with a key pays for it (and
# every job of a fair lane, where a job without a key is stored under FAIR_NO_KEY).
KEY_INDEX_DDL: tuple[str, ...] = (
    f"""CREATE INDEX IF NOT EXISTS {JOBS}_key ON {JOBS} (lane, flow_key, run_at, id)
        WHERE flow_key IS NOT NULL""",
)
# What a fair lane stores as the key of a job enqueued without one: it takes its turns like a
# key. Never a key of a caller's (those are 1-200 printable characters).
FAIR_NO_KEY = ""

# How many messages each lane ever stored (`LaneStats.stored`): a sequence per lane, made by
# `ensure` (`COUNTER_CREATE`), and a trigger that draws one number of it per row inserted into
# the jobs table (a publish, a requeue, an event copied to a group). A sequence, not a counter
# row: drawing from it takes no lock, so concurrent publishers never queue behind each other;
# and a draw is not undone by a rollback, so a rolled-back publish counts too. A lane with no
# sequence yet (not ensured since this counter came) counts nothing. The function and the
# trigger came with migration 0007; the sequences are made by `ensure`.
COUNTER_PREFIX = "mega_bus_stored_"  # + md5 of the lane key (a name fits in 63 bytes)
COUNTER_FUNCTION = "mega_bus_count_stored"
COUNTER_DDL: tuple[str, ...] = (
    f"""CREATE OR REPLACE FUNCTION {COUNTER_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE counter regclass := to_regclass('{COUNTER_PREFIX}' || md5(NEW.lane));
    BEGIN
        IF counter IS NOT NULL THEN PERFORM nextval(counter); END IF;
        RETURN NULL;
    END $$""",
    f"""DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = '{COUNTER_FUNCTION}') THEN
            CREATE TRIGGER {COUNTER_FUNCTION} AFTER INSERT ON {JOBS}
            FOR EACH ROW EXECUTE FUNCTION {COUNTER_FUNCTION}();
        END IF;
    END $$""",
)

# Whether the last of SCHEMA's steps are there: then `ensure` runs no DDL at all (DDL locks the
# tables, and workers of a started fleet are claiming rows in them).
SCHEMA_READY = f"""
SELECT to_regclass('{RECORDS}') IS NOT NULL AND to_regclass('{DEAD}_job') IS NOT NULL
   AND to_regclass('{JOBS}_band') IS NOT NULL
   AND EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = '{COUNTER_FUNCTION}')
"""

# Every table, where missing: what `PostgresBus.ensure` runs.
SCHEMA = (
    DDL
    + RECORDS_DDL
    + ADDED_COLUMNS_DDL
    + DEAD_INDEX_DDL
    + BAND_INDEX_DDL
    + COUNTER_DDL
    + KEY_INDEX_DDL
)
