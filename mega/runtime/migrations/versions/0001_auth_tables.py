"""The login tables: users, server-side sessions, failed login attempts.

Revision ID: 0001
Revises: (none)

Databases created before migrations existed (by `create_all`) already have these tables: the
upgrade stamps them at this revision instead of creating them again (see migrate.py).
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mega_users",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("username", sa.String(64), nullable=False, unique=True),
        sa.Column("password_hash", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "mega_sessions",
        sa.Column("id_hash", sa.String(64), primary_key=True),
        sa.Column(
            "user_id",
            sa.Integer(),
            sa.ForeignKey("mega_users.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("csrf_token", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "mega_login_failures",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("username", sa.String(64), nullable=False),
        sa.Column("ip", sa.String(64), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_mega_login_failures_username_at", "mega_login_failures", ["username", "at"])
    op.create_index("ix_mega_login_failures_ip_at", "mega_login_failures", ["ip", "at"])


def downgrade() -> None:
    op.drop_table("mega_login_failures")
    op.drop_table("mega_sessions")
    op.drop_table("mega_users")
