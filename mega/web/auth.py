"""Login, server-side sessions, CSRF and failed-login limiting.

- The session cookie carries one random id, signed with itsdangerous; the database holds its
  SHA-256.
  Logging in always starts a new session (no fixation) with a fresh CSRF token; logging out
  deletes the row, so a stolen cookie dies with it.
- CSRF: every POST/PUT/PATCH/DELETE carries the token as form field `csrf_token` or header
  `X-CSRF-Token`, compared in constant time with the session's token (or, before login, with
  the signed anonymous token cookie: a signed double-submit).
- Failed logins are counted per (username, IP) and per IP in a sliding window. After the second
  failure of a pair the next try waits a delay that doubles each time; past a limit, the pair
  (or the IP) waits until enough failures leave the window. A refused try is answered 429 with
  Retry-After, takes as long as a checked one (the KDF runs against a dummy hash) and is not
  itself counted. A success clears its pair's failures, so one user cannot lock another out
  from elsewhere.
- Passwords are Argon2id (see passwords.py); a hash in an older format is replaced at the next
  successful login.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import math
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated
from urllib.parse import urlsplit

import anyio.to_thread
from fastapi import Depends, HTTPException, Request
from itsdangerous import BadSignature, Signer
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from mega.config import AuthConfig
from mega.constants import ANON_CSRF_COOKIE, CSRF_FORM_FIELD, CSRF_HEADER, SESSION_COOKIE
from mega.database import Database
from mega.web.models import LoginFailure, User, UserSession
from mega.web.passwords import DUMMY_HASH, hash_password, verify_and_update, verify_password

UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
# The longest delay between two tries of a (username, IP) pair below its limit.
MAX_LOGIN_DELAY_S = 60


@dataclass(frozen=True)
class CurrentUser:
    id: int
    username: str
    csrf_token: str


# ---- signing -------------------------------------------------------------------------------


@functools.cache
def _signer(key: str) -> Signer:
    # HMAC-SHA1 over a key derived from MEGA_SECRET_KEY and this salt (itsdangerous' defaults).
    return Signer(key, salt="mega.cookie")


def sign(value: str, key: str) -> str:
    """`value` with its signature appended (itsdangerous), for a cookie."""
    signed: bytes = _signer(key).sign(value)
    return signed.decode()


def unsign(signed: str | None, key: str) -> str | None:
    """The value of a cookie signed by `sign`, or None when it is absent, forged or malformed."""
    if not signed:
        return None
    try:
        value: bytes = _signer(key).unsign(signed)
        return value.decode()
    except (BadSignature, UnicodeError):
        return None


def _id_hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)


def _aware(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; every value we store is UTC.
    return value if value.tzinfo else value.replace(tzinfo=UTC)


# ---- sessions ------------------------------------------------------------------------------


def settings(request: Request) -> AuthConfig:
    config: AuthConfig = request.app.state.auth
    return config


def database(request: Request) -> Database:
    db: Database = request.app.state.ctx.db
    return db


async def current_user(request: Request) -> CurrentUser | None:
    """The logged-in user, or None. Looked up once per request."""
    if hasattr(request.state, "user"):
        user: CurrentUser | None = request.state.user
        return user
    session_id = unsign(request.cookies.get(SESSION_COOKIE), settings(request).secret_key)
    found: CurrentUser | None = None
    if session_id:
        id_hash = _id_hash(session_id)

        def lookup(db: Session) -> CurrentUser | None:
            row = db.execute(
                select(UserSession, User)
                .join(User, User.id == UserSession.user_id)
                .where(UserSession.id_hash == id_hash)
            ).first()
            if row is None:
                return None
            session, user = row
            if _aware(session.expires_at) <= _now():
                db.delete(session)
                return None
            return CurrentUser(user.id, user.username, session.csrf_token)

        found = await database(request).run(lookup)
    request.state.user = found
    return found


async def require_user(request: Request) -> CurrentUser:
    """Dependency for every page and /api route behind the login: 401 (JSON) or a redirect
    to /login."""
    user = await current_user(request)
    if user is None:
        raise HTTPException(401, "log in first")
    return user


UserDep = Annotated[CurrentUser, Depends(require_user)]


async def start_session(request: Request, user_id: int) -> tuple[str, str]:
    """Create a session; returns (signed cookie value, csrf token)."""
    session_id = secrets.token_urlsafe(32)
    csrf_token = secrets.token_urlsafe(32)
    max_age = timedelta(seconds=settings(request).session_max_age_s)
    now = _now()

    def insert(db: Session) -> None:
        db.execute(delete(UserSession).where(UserSession.expires_at <= now))
        db.add(
            UserSession(
                id_hash=_id_hash(session_id),
                user_id=user_id,
                csrf_token=csrf_token,
                created_at=now,
                expires_at=now + max_age,
            )
        )

    await database(request).run(insert)
    return sign(session_id, settings(request).secret_key), csrf_token


async def end_session(request: Request) -> None:
    session_id = unsign(request.cookies.get(SESSION_COOKIE), settings(request).secret_key)
    if session_id:
        id_hash = _id_hash(session_id)
        await database(request).run(
            lambda db: db.execute(delete(UserSession).where(UserSession.id_hash == id_hash))
        )


# ---- CSRF ----------------------------------------------------------------------------------


def anon_csrf_token(request: Request) -> str:
    """The pre-login token: from the signed cookie, or a new one the middleware will set."""
    key = settings(request).secret_key
    token = unsign(request.cookies.get(ANON_CSRF_COOKIE), key)
    if token is None:
        token = getattr(request.state, "new_anon_csrf", None) or secrets.token_urlsafe(32)
        request.state.new_anon_csrf = token
    return token


async def csrf_protect(request: Request) -> None:
    """App-wide dependency: unsafe methods must carry the right token, else 403."""
    if request.method not in UNSAFE_METHODS:
        return
    user = await current_user(request)
    if user is None and request.url.path.startswith("/api/"):
        # Every API route needs a session: say so (401) before judging the token.
        raise HTTPException(401, "log in first")
    sent = request.headers.get(CSRF_HEADER)
    if sent is None and request.headers.get("content-type", "").startswith(
        ("application/x-www-form-urlencoded", "multipart/form-data")
    ):
        value = (await request.form()).get(CSRF_FORM_FIELD)
        sent = value if isinstance(value, str) else None
    if user is not None:
        expected = user.csrf_token
    else:
        expected = unsign(request.cookies.get(ANON_CSRF_COOKIE), settings(request).secret_key) or ""
    if not sent or not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise HTTPException(403, "missing or wrong CSRF token; reload the page and try again")


# ---- login ---------------------------------------------------------------------------------


def safe_next(target: str | None, default: str = "/") -> str:
    """`target` if it is a local path, else `default` (the config's `auth.landing_path`).

    Local: no scheme, no host, not `//host` nor `/\\host`, no control characters."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return default
    if "\\" in target or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in target):
        return default
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return default
    return target


@dataclass(frozen=True)
class LoginAttempt:
    """What `authenticate` decided: the user id, or none; `retry_after_s` > 0 when the try was
    refused by the limits before its password was looked at."""

    user_id: int | None = None
    retry_after_s: int = 0


def wait_before_next_try(
    now: datetime, failures: list[datetime], limit: int, window_s: int, *, progressive: bool
) -> float:
    """Seconds until the next try is allowed, from the failures still in the window (oldest
    first). At `limit` failures: until the oldest that matters leaves the window. Before that,
    when `progressive`, a delay after the last failure: 1 s after the second, doubling with each
    one after it (at most MAX_LOGIN_DELAY_S)."""
    count = len(failures)
    if count >= limit:
        release = failures[count - limit] + timedelta(seconds=window_s)
    elif progressive and count >= 2:
        release = failures[-1] + timedelta(seconds=min(2 ** (count - 2), MAX_LOGIN_DELAY_S))
    else:
        return 0.0
    return max(0.0, (release - now).total_seconds())


async def authenticate(request: Request, username: str, password: str, ip: str) -> LoginAttempt:
    """Check a login against the limits, then the password (see the module's docstring)."""
    config = settings(request)
    now = _now()
    since = now - timedelta(seconds=config.login_window_s)
    username = username.strip()[:64]

    def look_up(db: Session) -> tuple[list[datetime], list[datetime], User | None]:
        recent = select(LoginFailure.at).where(LoginFailure.ip == ip, LoginFailure.at > since)
        pair = db.scalars(recent.where(LoginFailure.username == username).order_by("at"))
        from_ip = db.scalars(recent.order_by("at"))
        user = db.scalar(select(User).where(User.username == username))
        return [_aware(at) for at in pair], [_aware(at) for at in from_ip], user

    db = database(request)
    pair, from_ip, user = await db.run(look_up)
    window = config.login_window_s
    wait_s = max(
        wait_before_next_try(now, pair, config.login_max_failures, window, progressive=True),
        wait_before_next_try(now, from_ip, config.login_ip_max_failures, window, progressive=False),
    )
    # The KDF always runs (against a dummy hash for an unknown user or a refused try), so the
    # time of an answer tells neither whether the user exists nor whether a limit was hit.
    encoded = user.password_hash if user is not None and not wait_s else DUMMY_HASH
    good, new_hash = await anyio.to_thread.run_sync(verify_and_update, password, encoded)
    if wait_s:
        return LoginAttempt(retry_after_s=math.ceil(wait_s))
    if good and user is not None:
        user_id = user.id

        def succeeded(db: Session) -> None:
            if new_hash is not None:  # an older format or cost: store the current one
                _store_hash(user_id, new_hash, db)
            db.execute(
                delete(LoginFailure).where(LoginFailure.username == username, LoginFailure.ip == ip)
            )

        await db.run(succeeded)
        return LoginAttempt(user_id=user_id)

    def record(db: Session) -> None:
        db.execute(delete(LoginFailure).where(LoginFailure.at <= since))
        db.add(LoginFailure(username=username, ip=ip, at=now))

    await db.run(record)
    return LoginAttempt()


def _store_hash(user_id: int, password_hash: str, db: Session) -> None:
    user = db.get(User, user_id)
    if user is not None:
        user.password_hash = password_hash


def ensure_user(db: Database, username: str, password: str) -> None:
    """Create the user, or reset its password if it differs (the web host does this for each
    user of the config's `auth.users`)."""
    with db.sessions.begin() as session:
        user = session.scalar(select(User).where(User.username == username))
        if user is None:
            session.add(
                User(username=username, password_hash=hash_password(password), created_at=_now())
            )
        elif not verify_password(password, user.password_hash):
            user.password_hash = hash_password(password)
