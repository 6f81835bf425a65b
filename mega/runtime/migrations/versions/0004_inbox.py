"""The transactional inbox: the event ids each listener group with `inbox = "db"` completed.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mega_inbox",
        sa.Column("group_name", sa.String(255), primary_key=True),
        sa.Column("event_id", sa.String(255), primary_key=True),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_mega_inbox_group_done_at", "mega_inbox", ["group_name", "done_at"])


def downgrade() -> None:
    op.drop_table("mega_inbox")
