"""The `postgres` bus driver's additions for tracing, flow control and the operator's console:
the trace context a job row or an event carries, the key a job was enqueued with, an index of
the dead letters by job id, and the counter of what each lane ever stored (a trigger drawing
from a sequence per lane).

Revision ID: 0007
Revises: 0006

PostgreSQL only, like 0003 (a no-op on SQLite). The DDL is the driver's own
(mega/drivers/postgres/schema.py), idempotent, the same the driver runs when it finds a database
nobody migrated.
"""

from alembic import op

from mega.drivers.postgres.schema import (
    ADDED_COLUMNS,
    ADDED_COLUMNS_DDL,
    BAND_INDEX_DDL,
    COUNTER_DDL,
    COUNTER_FUNCTION,
    DEAD,
    DEAD_INDEX_DDL,
    JOBS,
)

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for statement in ADDED_COLUMNS_DDL + DEAD_INDEX_DDL + BAND_INDEX_DDL + COUNTER_DDL:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP TRIGGER IF EXISTS {COUNTER_FUNCTION} ON {JOBS}")
    op.execute(f"DROP FUNCTION IF EXISTS {COUNTER_FUNCTION}()")
    op.execute(f"DROP INDEX IF EXISTS {DEAD}_job")
    op.execute(f"DROP INDEX IF EXISTS {JOBS}_band")
    for table, column in ADDED_COLUMNS:
        op.execute(f"ALTER TABLE {table} DROP COLUMN IF EXISTS {column}")
