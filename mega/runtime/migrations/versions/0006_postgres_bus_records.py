"""The records of the `postgres` bus driver's lanes: a job's status and result, with an expiry.

Revision ID: 0006
Revises: 0005

PostgreSQL only, like 0003 (a no-op on SQLite). The DDL is the driver's own
(mega/drivers/postgres/schema.py), `IF NOT EXISTS`, the same the driver runs when it finds a
database nobody migrated.
"""

from alembic import op

from mega.drivers.postgres.schema import RECORDS, RECORDS_DDL

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for statement in RECORDS_DDL:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP TABLE IF EXISTS {RECORDS}")
