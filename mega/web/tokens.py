"""API tokens: how a script or another service calls the JSON routes, without a browser.

    mega token create deploy-bot        # prints the token, once: mega_...
    curl -X POST -H "Authorization: Bearer mega_..." -H "Content-Type: application/json" \\
         -d '{"name": "x"}' http://127.0.0.1:8000/api/things

A request with `Authorization: Bearer <token>` is authenticated by the token alone, and needs
no CSRF token: CSRF forges what a browser attaches by itself (its cookies), and a header that
a script sets is not one of those. A request with a session cookie still needs its CSRF token,
exactly as before. A wrong or revoked token is a 401, never a fall-back to the cookie.

The token is 32 random bytes; the table keeps only its SHA-256 (`mega_api_tokens`), so a copy
of the database lets nobody in, and `mega token list` shows names and dates, never tokens.
Tokens are high-entropy, so a plain hash is enough (a slow password hash is for guessable
secrets). `mega token revoke NAME` deletes the row: the next request with it is a 401.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import DateTime, String, delete, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from mega.database import Base
from mega.web.models import as_utc

# What every token starts with: a leaked one is easy to recognise (and to search for).
TOKEN_PREFIX = "mega_"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
NAME_RULE = "1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit"
# `last_used_at` is written at most this often per token: a busy client costs no write per call.
LAST_USED_EVERY = timedelta(minutes=1)


class ApiToken(Base):
    """A token a service authenticates with; the row holds its SHA-256, not the token."""

    __tablename__ = "mega_api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class TokenError(ValueError):
    """A token command that cannot be done, with the sentence that says why."""


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(db: Session, name: str) -> str:
    """Store a new token under `name`; returns the token (shown once, never stored)."""
    if not NAME_RE.fullmatch(name):
        raise TokenError(f"token name {name!r}: {NAME_RULE}")
    if db.scalar(select(ApiToken.id).where(ApiToken.name == name)) is not None:
        raise TokenError(f"a token named {name!r} exists: revoke it first, or pick another name")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    db.add(ApiToken(name=name, token_hash=hash_token(token), created_at=datetime.now(UTC)))
    return token


@dataclass(frozen=True)
class TokenInfo:
    """What `mega token list` shows of a token: never the token."""

    name: str
    created_at: datetime
    last_used_at: datetime | None

    def describe(self) -> str:
        used = (
            as_utc(self.last_used_at).isoformat(timespec="seconds")
            if self.last_used_at
            else "never"
        )
        created = as_utc(self.created_at).isoformat(timespec="seconds")
        return f"{self.name}\tcreated {created}\tlast used {used}"


def list_tokens(db: Session) -> list[TokenInfo]:
    rows = db.execute(
        select(ApiToken.name, ApiToken.created_at, ApiToken.last_used_at).order_by(ApiToken.name)
    )
    return [TokenInfo(*row) for row in rows]


def revoke_token(db: Session, name: str) -> bool:
    """Delete the token named `name`; False when there is none."""
    return bool(db.execute(delete(ApiToken).where(ApiToken.name == name)).rowcount)  # type: ignore[attr-defined]


def token_name(db: Session, token: str) -> str | None:
    """The name of the token `token`, or None when no such token exists (wrong or revoked)."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    row = db.scalars(select(ApiToken).where(ApiToken.token_hash == hash_token(token))).first()
    if row is None:
        return None
    now = datetime.now(UTC)
    if row.last_used_at is None or now - as_utc(row.last_used_at) >= LAST_USED_EVERY:
        db.execute(update(ApiToken).where(ApiToken.id == row.id).values(last_used_at=now))
    return row.name
