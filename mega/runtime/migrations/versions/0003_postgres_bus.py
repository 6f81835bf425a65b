"""The tables of the `postgres` bus driver: jobs, dead letters, dedup keys, events, cursors.

Revision ID: 0003
Revises: 0002

PostgreSQL only (the driver needs FOR UPDATE SKIP LOCKED, LISTEN/NOTIFY and jsonb): on SQLite
the upgrade records the revision and creates nothing. The DDL is the driver's own
(mega/drivers/postgres/schema.py), `IF NOT EXISTS`, the same the driver runs when it finds a
database nobody migrated.
"""

from alembic import op

from mega.drivers.postgres.schema import DDL, TABLES

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for statement in DDL:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f"DROP TABLE IF EXISTS {table}")
