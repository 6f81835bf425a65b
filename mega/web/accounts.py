"""The accounts a login checks: a login's password checked under the failed-login limits
(`authenticate`, see auth.py's module for the rules), the device cookie a successful login
leaves, where a login may send the browser next (`safe_next`), and the users of the config
created or reset at start (`ensure_user`). Passwords are Argon2id (passwords.py); a hash in an
older format is replaced at the next successful login.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio.to_thread
from fastapi import Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from mega.constants import DEVICE_COOKIE
from mega.database import Database
from mega.web import limits
from mega.web.auth import database, settings, utcnow
from mega.web.limits import limit_key, normalise_username
from mega.web.models import User
from mega.web.passwords import DUMMY_HASH, hash_password, verify_and_update, verify_password


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
    username: str = ""  # the user's name as stored, when `user_id` is set
    retry_after_s: int = 0


async def authenticate(request: Request, username: str, password: str, ip: str) -> LoginAttempt:
    """Check a login against the limits, then the password (see the module's docstring)."""
    config = settings(request)
    now = utcnow()
    name = normalise_username(username)
    key = limit_key(name)
    known_device = name == limits.device_username(
        request.cookies.get(DEVICE_COOKIE), config.secret_key, config.device_cookie_max_age_s
    )

    def look_up(db: Session) -> tuple[limits.RecentFailures, User | None]:
        user = db.scalar(select(User).where(User.username == name))
        return limits.recent_failures(db, key, ip, now, config), user

    db = database(request)
    failures, user = await db.run(look_up)
    wait_s = limits.wait_s(failures, now, config, known_device=known_device)
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
            limits.clear_pair(db, key, ip)

        await db.run(succeeded)
        return LoginAttempt(user_id=user_id, username=name)

    await db.run(lambda db: limits.record_failure(db, key, ip, now, config))
    return LoginAttempt()


def device_cookie(request: Request, username: str) -> str:
    """The device cookie a successful login of `username` leaves in its browser (limits.py)."""
    return limits.device_cookie(username, settings(request).secret_key)


def _store_hash(user_id: int, password_hash: str, db: Session) -> None:
    user = db.get(User, user_id)
    if user is not None:
        user.password_hash = password_hash


def ensure_user(db: Database, username: str, password: str) -> None:
    """Create the user, or reset its password if it differs (the web host does this for each
    user of the config's `auth.users`). The name is stored normalised (`normalise_username`),
    the form a login looks it up by.

    Args:
        db: the database with the framework's tables (migrated).
        username: the user's login name.
        password: the user's password in clear; only its Argon2id hash is stored.
    """
    username = normalise_username(username)
    with db.sessions.begin() as session:
        user = session.scalar(select(User).where(User.username == username))
        if user is None:
            session.add(
                User(username=username, password_hash=hash_password(password), created_at=utcnow())
            )
        elif not verify_password(password, user.password_hash):
            user.password_hash = hash_password(password)
