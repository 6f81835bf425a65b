"""Access: each API token's scopes and end (mega/web/tokens.py), and the audit of console
actions (mega/web/audit.py).

Revision ID: 0009
Revises: 0008

Tokens made before this could do everything: they keep every scope, and no end.
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

EVERY_SCOPE = "jobs:enqueue,console:read,console:operate,console:admin"


def upgrade() -> None:
    with op.batch_alter_table("mega_api_tokens") as table:
        table.add_column(
            sa.Column("scopes", sa.String(255), nullable=False, server_default=EVERY_SCOPE)
        )
        table.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "mega_audit",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(80), nullable=False),
        sa.Column("action", sa.String(40), nullable=False),
        sa.Column("target", sa.String(200), nullable=False),
        sa.Column("ids", sa.Text, nullable=False),
        sa.Column("detail", sa.String(200), nullable=False, server_default=""),
    )
    op.create_index("ix_mega_audit_target_at", "mega_audit", ["target", "at"])
    op.create_index("ix_mega_audit_at", "mega_audit", ["at"])


def downgrade() -> None:
    op.drop_index("ix_mega_audit_at", "mega_audit")
    op.drop_index("ix_mega_audit_target_at", "mega_audit")
    op.drop_table("mega_audit")
    with op.batch_alter_table("mega_api_tokens") as table:
        table.drop_column("expires_at")
        table.drop_column("scopes")
