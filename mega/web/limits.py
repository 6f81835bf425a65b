"""Failed-login limits: per (username, client IP), per client IP and per account, and the device
cookie that exempts a browser which logged in before from the account's limit.

- Every limit is keyed on `normalise_username(...)`, the same form the user is looked up by, so
  " demo", "demo\\n", "\\xa0demo" and the full-width "ｄｅｍｏ" are one account (`demo`) for the
  password check and for the counting alike: no spelling of a name gets a budget of its own.
- Why per account: the other two limits are per address, so an attacker with many addresses
  would get `login_max_failures` tries per address per window on one account, without end. The
  account limit (`login_account_max_failures`, 100 an hour, as OWASP ASVS 2.2.1 asks) stops
  that whatever the number of addresses.
- Why a device cookie: a limit per account is also a way to lock its owner out (fail 100 times,
  the owner cannot log in for an hour). A successful login leaves a signed cookie in that browser
  (the username and when it was issued, nothing of the session); from a browser carrying it for
  that username the account limit does not apply. The per-(username, IP) and per-IP limits
  still do: the cookie is no licence to guess.

The decisions are pure (`wait_before_next_try`, `wait_s`); the reads and writes of
`LoginFailure` rows are the small functions below them. Counting and checking are not one
transaction: a burst of simultaneous tries can pass a limit by the number in flight, each of
them still paying for a KDF run.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from itsdangerous import BadSignature, URLSafeTimedSerializer
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from mega.settings import AuthConfig
from mega.web.models import LoginFailure, as_utc

# The longest delay between two tries of a (username, IP) pair below its limit.
MAX_LOGIN_DELAY_S = 60
# `LoginFailure.username`'s width: a longer name (which no user can have) is counted by its
# first 64 characters.
USERNAME_KEY_CHARS = 64


def normalise_username(username: str) -> str:
    """The one form of a username that the user store and every limit use: Unicode NFKC (so
    full-width letters and a no-break space become their plain forms), then surrounding
    whitespace stripped. No case folding: users are looked up with SQL `=`, which compares
    case-sensitively on SQLite and PostgreSQL, so `Demo` is another account than `demo` (and
    counting it apart costs `demo` nothing).

    Args:
        username: a username as typed in the login form or written in the config.
    """
    return unicodedata.normalize("NFKC", username).strip()


def limit_key(username: str) -> str:
    """The `LoginFailure.username` a normalised username is counted under."""
    return username[:USERNAME_KEY_CHARS]


# ---- the decisions (pure) --------------------------------------------------------------------


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


@dataclass(frozen=True)
class RecentFailures:
    """The failures that matter to one try, oldest first."""

    pair: list[datetime]  # this username from this IP, within `login_window_s`
    ip: list[datetime]  # this IP, any username, within `login_window_s`
    account: list[datetime]  # this username from any IP, within `login_account_window_s`


def wait_s(
    failures: RecentFailures, now: datetime, config: AuthConfig, *, known_device: bool
) -> float:
    """Seconds this try must wait (0: check its password). `known_device`: the browser carries
    a valid device cookie for this username, which lifts the account limit only."""
    window, account_window = config.login_window_s, config.login_account_window_s
    pair = wait_before_next_try(
        now, failures.pair, config.login_max_failures, window, progressive=True
    )
    ip = wait_before_next_try(
        now, failures.ip, config.login_ip_max_failures, window, progressive=False
    )
    account = 0.0
    if not known_device:
        account = wait_before_next_try(
            now,
            failures.account,
            config.login_account_max_failures,
            account_window,
            progressive=False,
        )
    return max(pair, ip, account)


# ---- the rows --------------------------------------------------------------------------------


def recent_failures(
    db: Session, key: str, ip: str, now: datetime, config: AuthConfig
) -> RecentFailures:
    since = now - timedelta(seconds=config.login_window_s)
    account_since = now - timedelta(seconds=config.login_account_window_s)
    at = select(LoginFailure.at).order_by(LoginFailure.at)
    by_ip = at.where(LoginFailure.ip == ip, LoginFailure.at > since)
    return RecentFailures(
        pair=_aware_all(db.scalars(by_ip.where(LoginFailure.username == key))),
        ip=_aware_all(db.scalars(by_ip)),
        account=_aware_all(
            db.scalars(at.where(LoginFailure.username == key, LoginFailure.at > account_since))
        ),
    )


def record_failure(db: Session, key: str, ip: str, now: datetime, config: AuthConfig) -> None:
    """Count one failure, and forget those no limit looks at any more."""
    longest = max(config.login_window_s, config.login_account_window_s)
    db.execute(delete(LoginFailure).where(LoginFailure.at <= now - timedelta(seconds=longest)))
    db.add(LoginFailure(username=key, ip=ip, at=now))


def clear_pair(db: Session, key: str, ip: str) -> None:
    """A success forgets its pair's failures (so one user cannot lock another out from
    elsewhere); the account's failures from other addresses stay counted."""
    db.execute(delete(LoginFailure).where(LoginFailure.username == key, LoginFailure.ip == ip))


def _aware_all(values: Iterable[datetime]) -> list[datetime]:
    return [as_utc(value) for value in values]


# ---- the device cookie -----------------------------------------------------------------------


def _device_serializer(secret_key: str) -> URLSafeTimedSerializer:
    # Its own salt: a session or CSRF cookie's signature is never a device cookie's.
    return URLSafeTimedSerializer(secret_key, salt="mega.device")


def device_cookie(username: str, secret_key: str) -> str:
    """The device cookie's value for `username` (normalised): the name and the time of issue,
    signed with the app's secret (itsdangerous)."""
    value: str = _device_serializer(secret_key).dumps(username)
    return value


def device_username(cookie: str | None, secret_key: str, max_age_s: int) -> str | None:
    """The username a device cookie was issued for, or None when it is absent, forged,
    malformed or older than `max_age_s`."""
    if not cookie:
        return None
    try:
        username = _device_serializer(secret_key).loads(cookie, max_age=max_age_s)
    except (BadSignature, UnicodeError, ValueError):  # SignatureExpired is a BadSignature
        return None
    return username if isinstance(username, str) else None
