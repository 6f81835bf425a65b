"""The `postgres` bus driver's index of keyed jobs by key, which a fair lane's claim walks (one
probe per key, instead of ranking every row waiting).

Revision ID: 0008
Revises: 0007

PostgreSQL only, like 0003 (a no-op on SQLite). The DDL is the driver's own
(mega/drivers/postgres/schema.py), `IF NOT EXISTS`, the same the driver runs when it finds a
database nobody migrated.
"""

from alembic import op

from mega.drivers.postgres.schema import JOBS, KEY_INDEX_DDL

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for statement in KEY_INDEX_DDL:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP INDEX IF EXISTS {JOBS}_key")
