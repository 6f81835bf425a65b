"""The framework's tables: users, server-side sessions and failed login attempts."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from mega.database import Base, as_utc

__all__ = ["LoginFailure", "User", "UserSession", "as_utc"]


class User(Base):
    __tablename__ = "mega_users"

    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class UserSession(Base):
    """A login. The cookie holds the random id; the row holds only its SHA-256, so a copy of
    the database does not let anyone log in. Deleting the row logs the session out everywhere."""

    __tablename__ = "mega_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("mega_users.id", ondelete="CASCADE"))
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class LoginFailure(Base):
    """One failed login, counted per username and per client IP inside a sliding window."""

    __tablename__ = "mega_login_failures"

    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(String(64))
    ip: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        Index("ix_mega_login_failures_username_at", "username", "at"),
        Index("ix_mega_login_failures_ip_at", "ip", "at"),
    )
