"""Who is asking, server-side sessions and CSRF; the accounts and a login's check under the
failure limits are in accounts.py.

- The session cookie carries one random id, signed with itsdangerous; the database holds its
  SHA-256.
  Logging in always starts a new session (no fixation) with a fresh CSRF token; logging out
  deletes the row, so a stolen cookie dies with it.
- CSRF: every POST/PUT/PATCH/DELETE carries the token as form field `csrf_token` or header
  `X-CSRF-Token`, compared in constant time with the session's token (or, before login, with
  the signed anonymous token cookie: a signed double-submit).
- Failed logins are counted per (username, IP), per IP and per account in sliding windows
  (limits.py). After the second failure of a pair the next try waits a delay that doubles each
  time; past a limit, the pair, the IP or the account waits until enough failures leave the
  window. A browser that logged in before carries a device cookie that lifts the account's
  limit, so an attacker cannot lock the owner out. A refused try is answered 429 with
  Retry-After, takes as long as a checked one (the KDF runs against a dummy hash) and is not
  itself counted. A success clears its pair's failures, so one user cannot lock another out
  from elsewhere.
- Usernames are normalised once (`normalise_username`) for the lookup and every limit alike.
- Passwords are Argon2id (see passwords.py); a hash in an older format is replaced at the next
  successful login.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import math
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from itsdangerous import BadSignature, Signer
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from mega import audit, clock
from mega.constants import (
    ANON_CSRF_COOKIE,
    CSRF_FORM_FIELD,
    CSRF_HEADER,
    SESSION_COOKIE,
)
from mega.database import Database
from mega.settings import AuthConfig, Role
from mega.web import limits, tokens
from mega.web.models import User, UserSession, as_utc

logger = logging.getLogger("mega.web.auth")
UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
LOGIN_PATH = "/login"


@dataclass(frozen=True)
class CurrentUser:
    """Who sent the request: a logged-in user (a session cookie, `csrf_token` its CSRF token),
    or a service with an API token (`token` its name, `id` None, `username` "token:<name>").
    `role`: its console access (`auth.roles` for a user, the scopes for a token; None: none);
    `scopes`: a token's (mega/web/tokens.py), None for a user."""

    id: int | None
    username: str
    csrf_token: str
    token: str | None = None
    role: Role | None = "admin"
    scopes: tuple[str, ...] | None = None


# Console roles, lowest first (mega.config.Role): each may do what the ones before it may.
ROLES: tuple[Role, ...] = ("viewer", "operator", "admin")
# What each role may do beyond the one before it, for the 403's sentence.
ROLE_MAY = {
    "viewer": "read",
    "operator": "retry, requeue, cancel, pause, resume and run now",
    "admin": "purge and delete",
}
# A wrong API token counts as a failed login of its address under this key, which no
# username can be (a username is stored stripped of surrounding spaces).
WRONG_TOKEN_KEY = " api-token"


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


def utcnow() -> datetime:
    """The time now, in UTC (what sessions and limits are stamped with), on mega's clock: a
    test drives a login's wait and a session's expiry with `mega.testing.fake_clock()`."""
    return clock.utcnow()


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
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        service = await _token_user(request, credentials.strip())
        request.state.user = service
        return service
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
            if as_utc(session.expires_at) <= utcnow():
                db.delete(session)
                return None
            return CurrentUser(
                user.id, user.username, session.csrf_token, role=user_role(request, user.username)
            )

        found = await database(request).run(lookup)
    request.state.user = found
    return found


def user_role(request: Request, username: str) -> Role:
    """A logged-in user's console role: `auth.roles`, else `auth.default_role`."""
    config = settings(request)
    return config.roles.get(username, config.default_role)


async def _token_user(request: Request, token: str) -> CurrentUser:
    """The service an API token names; a 401 for a wrong, revoked or expired one (no fall-back
    to the cookie: a client that sends a token means it). Wrong tokens count as failed logins
    of the client's address: past its limit, a 429 before any look-up."""
    config, ip, now = settings(request), client_ip(request), utcnow()
    db = database(request)

    def look_up(session: Session) -> tuple[float, tokens.Grant]:
        failures = limits.recent_failures(session, WRONG_TOKEN_KEY, ip, now, config)
        wait = limits.wait_s(failures, now, config, known_device=True)
        return wait, (tokens.Grant(None) if wait else tokens.token_grant(session, token))

    wait_s, grant = await db.run(look_up)
    if wait_s:
        logger.warning("API token refused unread from %s: too many wrong tokens lately", ip)
        raise HTTPException(
            429,
            f"too many wrong API tokens from this address: try again in {math.ceil(wait_s)} s",
            headers={"Retry-After": str(math.ceil(wait_s))},
        )
    if grant.name is None:
        await db.run(
            lambda session: limits.record_failure(session, WRONG_TOKEN_KEY, ip, now, config)
        )
        logger.warning("wrong or revoked API token from %s", ip)  # never the token
        raise HTTPException(401, "wrong or revoked API token (`mega token list` shows the names)")
    if grant.refused is not None:
        logger.warning("%s, used from %s", grant.refused, ip)
        raise HTTPException(401, f"{grant.refused}: make a new one with `mega token create`")
    role = tokens.role_of_scopes(grant.scopes)
    return CurrentUser(
        None, f"token:{grant.name}", "", token=grant.name, role=role, scopes=grant.scopes
    )


def client_ip(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def token_may(user: CurrentUser, method: str) -> str | None:
    """None when a token's scopes allow a request of `method`, else the sentence of the 403:
    a read needs a console scope, a write `jobs:enqueue` (or a console action's scope, which
    `require_role` then checks)."""
    scopes = user.scopes or ()
    if method in UNSAFE_METHODS:
        if {"jobs:enqueue", "console:operate", "console:admin"} & set(scopes):
            return None
        return f"API token {user.token!r} may not write: it lacks the scope jobs:enqueue"
    if user.role is not None:
        return None
    return f"API token {user.token!r} may not read: it lacks the scope console:read"


async def require_user(request: Request) -> CurrentUser:
    """Dependency for every page and /api route behind the login: 401 (JSON) or a redirect
    to /login; a 403 for a token whose scopes do not cover the request."""
    user = await current_user(request)
    if user is None:
        raise HTTPException(401, "log in first")
    if user.scopes is not None and (refused := token_may(user, request.method)) is not None:
        raise HTTPException(403, refused)
    return user


def require_role(role: Role) -> Callable[[Request], Awaitable[CurrentUser]]:
    """A dependency for a console action: the user (or token) must have `role` or a higher
    one, else a 403 that says who may, and what this one may do."""
    needed = ROLES.index(role)

    async def check(request: Request) -> CurrentUser:
        user = await require_user(request)
        if user.role is None or ROLES.index(user.role) < needed:
            has = f"the {user.role} role" if user.role else "no console role"
            how = "its console:* scope" if user.token else "auth.roles in the config"
            raise HTTPException(
                403,
                f"{user.username} may not do this: it takes the {role} role (which may "
                f"{ROLE_MAY[role]}), and {user.username} has {has} (set by {how})",
            )
        return user

    return check


UserDep = Annotated[CurrentUser, Depends(require_user)]


# A console action's user: an operator's (retry, requeue, cancel, pause, resume, run now) or an
# admin's (purge, delete), checked before the route runs (403 otherwise).
OperatorDep = Annotated[CurrentUser, Depends(require_role("operator"))]
AdminDep = Annotated[CurrentUser, Depends(require_role("admin"))]


async def audited(
    request: Request,
    user: CurrentUser,
    action: str,
    target: str,
    ids: Sequence[str] = (),
    detail: str = "",
) -> None:
    """Write the audit row of a console action by `user` (mega/audit.py).

    Args:
        request: the request of the action; the row goes to its app's database.
        user: who acted: its `username` is the row's actor (`token:<name>` for an API token).
        action: what was done, such as "retry", "purge" or "pause".
        target: what it was done to, such as `job:EmailJob` or `schedule:nightly`.
        ids: the ids the action named; the first `mega.audit.MAX_IDS` (100) are kept.
        detail: a few words more, such as "118 dead letters".
    """
    await audit.write(database(request), user.username, action, target, ids, detail)


async def start_session(request: Request, user_id: int) -> tuple[str, str]:
    """Create a session; returns (signed cookie value, csrf token)."""
    session_id = secrets.token_urlsafe(32)
    csrf_token = secrets.token_urlsafe(32)
    max_age = timedelta(seconds=settings(request).session_max_age_s)
    now = utcnow()

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
    """App-wide dependency: unsafe methods must carry the right token, else 403. The login
    form checks its own (`csrf_valid`), so that it can answer with the form and a sentence."""
    if request.method not in UNSAFE_METHODS or request.url.path == LOGIN_PATH:
        return
    if is_public(request):
        return  # a route that reads no session has nothing a forged request could borrow
    user = await current_user(request)
    if user is not None and user.token is not None:
        return  # an API token is a header the client set, not a cookie the browser adds
    if user is None and request.url.path.startswith("/api/"):
        # Every API route needs a session: say so (401) before judging the token.
        raise HTTPException(401, "log in first")
    if not await csrf_valid(request):
        raise HTTPException(403, "missing or wrong CSRF token; reload the page and try again")


def is_public(request: Request) -> bool:
    """Whether the request is for a route of a router given as `public_routers` (no login):
    its path and method match one, before routing as after."""
    path, method = request.url.path, request.method
    return any(
        pattern.match(path) and method in methods
        for pattern, methods in getattr(request.app.state, "public_routes", ())
    )


async def csrf_valid(request: Request) -> bool:
    """Whether the request carries the right token: the session's, or before login the one of
    the signed anonymous cookie; in the `X-CSRF-Token` header or a form's `csrf_token` field."""
    user = await current_user(request)
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
    return bool(sent and expected and hmac.compare_digest(sent.encode(), expected.encode()))
