"""The trace context a job row or an event of the `postgres` bus driver carries.

Revision ID: 0007
Revises: 0006

PostgreSQL only, like 0003 (a no-op on SQLite). The DDL is the driver's own
(mega/drivers/postgres/sql.py), `IF NOT EXISTS`, the same the driver runs when it finds a
database nobody migrated.
"""

from alembic import op

from mega.drivers.postgres.sql import EVENTS, JOBS, TRACE_DDL

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for statement in TRACE_DDL:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in (JOBS, EVENTS):
        op.execute(f"ALTER TABLE {table} DROP COLUMN IF EXISTS trace")
