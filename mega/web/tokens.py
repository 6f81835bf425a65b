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

A token has an end (`--expires 90d`; after it, a 401 that says so) and scopes, what it may do:

    jobs:enqueue      the application's own writes (POST, PUT, PATCH, DELETE of its routes)
    console:read      every read (GET): pages and JSON, job statuses included
    console:operate   a console operator's actions: retry, requeue, cancel, pause, resume, run now
    console:admin     a console admin's: purge and delete, and the operator's

The default, `jobs:enqueue,console:read`, is the narrowest that serves a JSON client: it
enqueues and reads what became of its jobs. A wrong token counts as a failed login of its
client's address (`auth.login_ip_max_failures` in `auth.login_window_s`), past which the
address gets 429s, and is logged with the address, never the token.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, get_args

from sqlalchemy import DateTime, String, delete, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from mega.database import Base
from mega.settings import Role
from mega.web.models import as_utc

# What every token starts with: a leaked one is easy to recognise (and to search for).
TOKEN_PREFIX = "mega_"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
NAME_RULE = "1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit"
# `last_used_at` is written at most this often per token: a busy client costs no write per call.
LAST_USED_EVERY = timedelta(minutes=1)

Scope = Literal["jobs:enqueue", "console:read", "console:operate", "console:admin"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
DEFAULT_SCOPES: tuple[Scope, ...] = ("jobs:enqueue", "console:read")
# The console role a token's scopes give (the highest wins); none of them: no console at all.
SCOPE_ROLES: dict[str, Role] = {
    "console:admin": "admin",
    "console:operate": "operator",
    "console:read": "viewer",
}
# `--expires`: a number and its unit.
EXPIRES_RE = re.compile(r"(\d{1,5})([mhdw])")
UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class ApiToken(Base):
    """A token a service authenticates with; the row holds its SHA-256, not the token."""

    __tablename__ = "mega_api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    scopes: Mapped[str] = mapped_column(String(255), server_default=",".join(SCOPES))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class TokenError(ValueError):
    """A token command that cannot be done, with the sentence that says why."""


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def parse_scopes(text: str) -> tuple[Scope, ...]:
    """`jobs:enqueue,console:read` as scopes; TokenError naming the unknown ones."""
    given = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in given if part not in SCOPES]
    if unknown or not given:
        raise TokenError(
            f"unknown scope(s) {', '.join(unknown) or '(none given)'}: give one or more of "
            f"{', '.join(SCOPES)}, separated by commas"
        )
    return tuple(scope for scope in SCOPES if scope in given)


def parse_expires(text: str) -> timedelta | None:
    """`90d`, `12h`, `30m`, `2w` as a duration, `never` as None; TokenError otherwise."""
    if text.strip() == "never":
        return None
    match = EXPIRES_RE.fullmatch(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise TokenError(
            f"--expires {text!r}: give a whole number and a unit, m, h, d or w (90d, 12h), or never"
        )
    return timedelta(seconds=int(match.group(1)) * UNIT_S[match.group(2)])


def create_token(
    db: Session,
    name: str,
    *,
    scopes: tuple[Scope, ...] = DEFAULT_SCOPES,
    expires_in: timedelta | None = None,
) -> str:
    """Store a new token under `name` with its scopes, ending `expires_in` from now (None:
    never); returns the token (shown once, never stored)."""
    if not NAME_RE.fullmatch(name):
        raise TokenError(f"token name {name!r}: {NAME_RULE}")
    if db.scalar(select(ApiToken.id).where(ApiToken.name == name)) is not None:
        raise TokenError(f"a token named {name!r} exists: revoke it first, or pick another name")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    now = datetime.now(UTC)
    db.add(
        ApiToken(
            name=name,
            token_hash=hash_token(token),
            created_at=now,
            scopes=",".join(scopes),
            expires_at=now + expires_in if expires_in is not None else None,
        )
    )
    return token


@dataclass(frozen=True)
class TokenInfo:
    """What `mega token list` shows of a token: never the token."""

    name: str
    created_at: datetime
    last_used_at: datetime | None
    scopes: str = ",".join(DEFAULT_SCOPES)
    expires_at: datetime | None = None

    def describe(self, now: datetime | None = None) -> str:
        used = (
            as_utc(self.last_used_at).isoformat(timespec="seconds")
            if self.last_used_at
            else "never"
        )
        created = as_utc(self.created_at).isoformat(timespec="seconds")
        if self.expires_at is None:
            ends = "never expires"
        else:
            at = as_utc(self.expires_at)
            past = at <= (now or datetime.now(UTC))
            ends = f"{'expired' if past else 'expires'} {at.isoformat(timespec='seconds')}"
        return f"{self.name}\tcreated {created}\tlast used {used}\t{ends}\tscopes {self.scopes}"


def list_tokens(db: Session) -> list[TokenInfo]:
    rows = db.execute(
        select(
            ApiToken.name,
            ApiToken.created_at,
            ApiToken.last_used_at,
            ApiToken.scopes,
            ApiToken.expires_at,
        ).order_by(ApiToken.name)
    )
    return [TokenInfo(*row) for row in rows]


def revoke_token(db: Session, name: str) -> bool:
    """Delete the token named `name`; False when there is none."""
    return bool(db.execute(delete(ApiToken).where(ApiToken.name == name)).rowcount)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Grant:
    """What a presented token is: its name and scopes, or why it lets nobody in (`refused`:
    "... expired at ...", None when it is valid). `name` is None for a wrong or revoked one."""

    name: str | None
    scopes: tuple[str, ...] = ()
    refused: str | None = None


def token_grant(db: Session, token: str) -> Grant:
    """The grant of the token `token`: a wrong or revoked one has no name; an expired one
    says when it ended."""
    if not token.startswith(TOKEN_PREFIX):
        return Grant(None)
    row = db.scalars(select(ApiToken).where(ApiToken.token_hash == hash_token(token))).first()
    if row is None:
        return Grant(None)
    now = datetime.now(UTC)
    if row.expires_at is not None and as_utc(row.expires_at) <= now:
        ended = as_utc(row.expires_at).isoformat(timespec="seconds")
        return Grant(row.name, refused=f"API token {row.name!r} expired at {ended}")
    if row.last_used_at is None or now - as_utc(row.last_used_at) >= LAST_USED_EVERY:
        db.execute(update(ApiToken).where(ApiToken.id == row.id).values(last_used_at=now))
    return Grant(row.name, tuple(row.scopes.split(",")))


def token_name(db: Session, token: str) -> str | None:
    """The name of a valid token `token`, or None (wrong, revoked or expired)."""
    grant = token_grant(db, token)
    return grant.name if grant.refused is None else None


def role_of_scopes(scopes: tuple[str, ...]) -> Role | None:
    """The console role a token's scopes give (the highest), or None for none."""
    for scope, role in SCOPE_ROLES.items():
        if scope in scopes:
            return role
    return None
