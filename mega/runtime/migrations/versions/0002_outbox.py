"""The transactional outbox: events waiting for the relay.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mega_outbox",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("event_id", sa.String(64), nullable=False, unique=True),
        sa.Column("bus", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("headers", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
    )
    pending = sa.text("published_at IS NULL")
    op.create_index(
        "ix_mega_outbox_pending",
        "mega_outbox",
        ["seq"],
        postgresql_where=pending,
        sqlite_where=pending,
    )
    op.create_index("ix_mega_outbox_published_at", "mega_outbox", ["published_at"])


def downgrade() -> None:
    op.drop_table("mega_outbox")
