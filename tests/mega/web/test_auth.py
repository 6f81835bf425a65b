"""Auth: login, sessions, CSRF, next=, the failed-login limits and the device cookie, escaping,
headers."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import math
import statistics
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import select
from sqlalchemy.orm import Session

from mega.config import Config
from mega.constants import DEVICE_COOKIE, SESSION_COOKIE
from mega.drivers.embedded import free_port
from mega.settings import AuthConfig
from mega.testing import fake_clock
from mega.web.accounts import ensure_user, safe_next
from mega.web.auth import sign
from mega.web.limits import (
    MAX_LOGIN_DELAY_S,
    RecentFailures,
    device_cookie,
    device_username,
    normalise_username,
    wait_before_next_try,
    wait_s,
)
from mega.web.models import LoginFailure, User
from mega.web.passwords import hash_password, verify_password
from tests.factories import (
    DEMO_PASSWORD,
    DEMO_USER,
    TEST_SECRET,
    config_for,
    csrf_from,
    login,
    web_client,
)

GENERIC = "Wrong username or password."


@pytest.fixture
def config(tmp_path: Path, nats_url: str, redis_url: str) -> Config:
    return config_for(
        tmp_path,
        nats_url,
        redis_url,
        login_max_failures=3,
        login_ip_max_failures=4,
        login_window_s=3,
    )


def from_ip(client: Any, ip: str) -> httpx.AsyncClient:
    """Another client of the same app, from another address."""
    transport = httpx.ASGITransport(app=client.app, client=(ip, 4444))
    return httpx.AsyncClient(transport=transport, base_url="http://testserver")


async def test_good_login_sets_session_and_redirects_to_next(config: Config) -> None:
    async with web_client(config) as client:
        page = await client.get("/login?next=/home?tab=2")
        token = csrf_from(page.text)
        response = await client.post(
            "/login",
            data={
                "username": DEMO_USER,
                "password": DEMO_PASSWORD,
                "csrf_token": token,
                "next": "/home?tab=2",
            },
        )
        assert response.status_code == 303
        assert response.headers["location"] == "/home?tab=2"
        cookie = response.headers["set-cookie"]
        assert SESSION_COOKIE in cookie and "HttpOnly" in cookie and "SameSite=lax" in cookie
        home = await client.get("/home")
        assert home.status_code == 200
        assert "<title>Home</title>" in home.text and DEMO_USER in home.text


@pytest.mark.parametrize("username,password", [(DEMO_USER, "wrong"), ("nobody", DEMO_PASSWORD)])
async def test_bad_login_gives_one_generic_message(
    config: Config, username: str, password: str
) -> None:
    async with web_client(config) as client:
        response = await login(client, username, password)
        assert response.status_code == 401
        assert GENERIC in response.text
        assert SESSION_COOKIE not in response.headers.get("set-cookie", "")
        assert (await client.get("/api/things")).status_code == 401


async def test_failures_slow_down_then_lock_the_pair_with_429_and_retry_after(
    config: Config,
) -> None:
    async with web_client(config) as client:
        with fake_clock() as clock:
            assert (await login(client, DEMO_USER, "wrong")).status_code == 401
            assert (await login(client, DEMO_USER, "wrong")).status_code == 401
            # After the second failure the next try waits 1 s: refused, unchecked, not counted.
            early = await login(client)
            assert early.status_code == 429 and early.headers["retry-after"] == "1"
            assert "Too many attempts. Try again in 1 second." in early.text
            await clock.advance(0.9)  # not yet
            assert (await login(client)).status_code == 429
            await clock.advance(0.1)  # the 1 s wait the answer asked for
            assert (await login(client, DEMO_USER, "wrong")).status_code == 401  # 3rd: locked
            locked = await login(client)  # even the right password
            assert locked.status_code == 429 and locked.headers["retry-after"] == "2"
            assert SESSION_COOKIE not in locked.headers.get("set-cookie", "")
            await clock.advance(2)
            assert (await login(client)).status_code == 303


async def test_a_lock_holds_one_address_only_and_a_success_resets_it(config: Config) -> None:
    async with web_client(config) as client:
        with fake_clock() as clock:
            for pause in (0, 0, 1):
                await clock.advance(pause)
                assert (await login(client, DEMO_USER, "wrong")).status_code == 401
            assert (await login(client)).status_code == 429
            # The same user from another address is not locked out by the attacker's failures.
            async with from_ip(client, "10.9.9.9") as other:
                assert (await login(other)).status_code == 303
            async with from_ip(client, "10.8.8.8") as third:
                assert (await login(third, DEMO_USER, "wrong")).status_code == 401
                assert (await login(third)).status_code == 303  # a success clears its failures
                await third.post(
                    "/logout", data={"csrf_token": csrf_from((await third.get("/home")).text)}
                )
                assert (await login(third, DEMO_USER, "wrong")).status_code == 401
                assert (await login(third, DEMO_USER, "wrong")).status_code == 401  # no delay yet


async def test_failures_from_one_address_across_usernames_are_limited(config: Config) -> None:
    async with web_client(config) as client:
        for name in ("a", "b", "c", "d"):
            assert (await login(client, name, "x")).status_code == 401
        refused = await login(client)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1


async def test_a_refused_try_takes_as_long_as_a_checked_one(config: Config) -> None:
    """The KDF runs for every answer: a locked pair cannot be told by its speed (a ratio of
    medians, each side with the same argon2 work; never an absolute time)."""
    async with web_client(config) as client:
        token = csrf_from((await client.get("/login")).text)

        async def timed(username: str) -> float:
            started = time.perf_counter()
            await client.post(
                "/login", data={"username": username, "password": "x", "csrf_token": token}
            )
            return time.perf_counter() - started

        checked = [await timed(f"nobody{n}") for n in range(3)]  # 3 failures of 3 pairs
        with fake_clock() as clock:
            for pause in (0, 0, 1):
                await clock.advance(pause)
                await timed("victim")
            refused = [await timed("victim") for _ in range(5)]
        assert statistics.median(refused) > 0.5 * statistics.median(checked)


def test_the_wait_before_the_next_try() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    ago = [now - timedelta(seconds=s) for s in (50, 30, 3)]

    def wait(failures: list[datetime], limit: int = 5, progressive: bool = True) -> float:
        return wait_before_next_try(now, failures, limit, 60, progressive=progressive)

    assert wait([]) == 0 and wait(ago[2:]) == 0  # one failure: no delay
    assert wait(ago[1:]) == 0  # two: 1 s after the last, which was 3 s ago
    assert wait(ago) == 0  # three: 2 s after the last
    assert wait([*ago[:2], now]) == 2.0
    assert wait([now - timedelta(seconds=1)] * 3 + [now]) == 4.0  # four: 4 s; five: the limit
    assert wait(ago, limit=3) == 10.0  # locked until the oldest leaves the 60 s window
    assert wait([*ago[:2], now], progressive=False) == 0  # an IP: the limit only
    assert wait([now] * 10, limit=5) == 60.0  # the 6th oldest (of 10) leaves last of five


def test_a_known_device_skips_the_account_limit_and_no_other() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    config = AuthConfig(secret_key=TEST_SECRET, login_account_max_failures=3)
    hour = [now - timedelta(minutes=m) for m in (50, 40, 30)]  # 3 in the hour: the limit

    def wait(pair: int, ip: int, known_device: bool) -> float:
        failures = RecentFailures(pair=[now] * pair, ip=[now] * ip, account=hour)
        return wait_s(failures, now, config, known_device=known_device)

    assert wait(0, 0, known_device=False) == 10 * 60  # until the oldest is an hour old
    assert wait(0, 0, known_device=True) == 0
    assert wait(5, 5, known_device=True) == 15 * 60  # the pair's limit (5 in 15 min) holds
    assert wait(0, 50, known_device=True) == 15 * 60  # and the address's (50)


async def test_session_rotated_at_login_and_revoked_at_logout(config: Config) -> None:
    async with web_client(config) as client:
        await login(client)
        first_cookie = client.cookies[SESSION_COOKIE]
        first_token = csrf_from((await client.get("/home")).text)
        await login_again(client)
        second_cookie = client.cookies[SESSION_COOKIE]
        second_token = csrf_from((await client.get("/home")).text)
        assert first_cookie != second_cookie and first_token != second_token

        response = await client.post("/logout", data={"csrf_token": second_token})
        assert response.status_code == 303 and response.headers["location"] == "/login"
        # The old cookie, replayed, no longer opens anything: the session is gone server-side.
        client.cookies.set(SESSION_COOKIE, second_cookie)
        assert (await client.get("/api/things")).status_code == 401
        client.cookies.set(SESSION_COOKIE, first_cookie)
        assert (await client.get("/api/things")).status_code == 401


async def login_again(client: httpx.AsyncClient) -> None:
    # A logged-in user posting the login form again gets a brand-new session.
    token = csrf_from((await client.get("/home")).text)
    response = await client.post(
        "/login", data={"username": DEMO_USER, "password": DEMO_PASSWORD, "csrf_token": token}
    )
    assert response.status_code == 303


async def test_csrf_missing_or_wrong_is_403_for_forms_and_json(config: Config) -> None:
    async with web_client(config) as client:
        page = await client.get("/login")
        token = csrf_from(page.text)
        creds = {"username": DEMO_USER, "password": DEMO_PASSWORD}
        assert (await client.post("/login", data=creds)).status_code == 403
        assert (
            await client.post("/login", data={**creds, "csrf_token": "x" + token})
        ).status_code == 403
        await login(client)
        token = csrf_from((await client.get("/home")).text)
        assert (await client.post("/logout", data={})).status_code == 403
        missing = await client.post("/api/things", json={"name": "x"})
        assert missing.status_code == 403
        body = missing.json()
        assert body["ok"] is False and body["error"]["code"] == "forbidden"
        wrong = await client.post(
            "/api/things", json={"name": "x"}, headers={"X-CSRF-Token": "nope"}
        )
        assert wrong.status_code == 403
        # Still logged in: nothing changed.
        assert (await client.get("/api/things")).json()["data"] == {"things": []}


@pytest.mark.parametrize("token", [None, "stale-token"])
async def test_a_login_form_without_its_token_comes_back_with_a_fresh_one(
    config: Config, token: str | None
) -> None:
    """A browser that lost the form's cookie (or kept a page from before) gets the form again,
    not an error page, and logs in with it."""
    async with web_client(config) as client:
        creds = {"username": DEMO_USER, "password": DEMO_PASSWORD}
        if token:  # a page from before: the cookie is there, the token in the form is not its
            await client.get("/login")
        sent = {**creds, "csrf_token": token} if token else creds  # else: no cookie, no token
        refused = await client.post("/login", data=sent)
        assert refused.status_code == 403
        assert refused.headers["content-type"].startswith("text/html")
        assert "This form has expired, or your browser did not send its cookie." in refused.text
        assert '<form method="post" action="/login">' in refused.text
        fresh = csrf_from(refused.text)
        assert fresh != token
        response = await client.post("/login", data={**creds, "csrf_token": fresh})
        assert response.status_code == 303


@pytest.mark.parametrize(
    "target",
    [
        "//evil.example",
        "https://evil.example",
        "/\\evil",
        "http:/evil",
        "javascript:alert(1)",
        "/ok\r\nSet-Cookie:x",
        "",
        "demo",
    ],
)
def test_next_only_to_a_local_path(target: str) -> None:
    assert safe_next(target, "/home") == "/home"


@pytest.mark.parametrize("target", ["/demo/jobs", "/demo/cron?x=1", "/"])
def test_next_keeps_local_paths(target: str) -> None:
    assert safe_next(target, "/home") == target


async def test_login_with_evil_next_redirects_home(config: Config) -> None:
    async with web_client(config) as client:
        for evil in ("//evil.example", "https://evil.example", "/\\evil"):
            client.cookies.clear()
            page = await client.get("/login")
            response = await client.post(
                "/login",
                data={
                    "username": DEMO_USER,
                    "password": DEMO_PASSWORD,
                    "csrf_token": csrf_from(page.text),
                    "next": evil,
                },
            )
            assert response.headers["location"] == "/home"  # the config's landing_path


async def test_anonymous_page_redirects_and_json_gets_401_envelope(config: Config) -> None:
    async with web_client(config) as client:
        page = await client.get("/home?x=1")
        assert page.status_code == 303
        assert page.headers["location"] == "/login?next=/home%3Fx%3D1"
        api = await client.get("/api/things")
        assert api.status_code == 401
        body = api.json()
        assert body["ok"] is False and body["error"]["code"] == "auth.required"
        assert "meta" in body


async def test_user_text_is_escaped(config: Config) -> None:
    async with web_client(config) as client:
        evil = '<script>alert("x")</script>'
        response = await login(client, evil, "nope")
        assert evil not in response.text
        assert "&lt;script&gt;" in response.text


async def test_security_headers_on_pages_and_api(config: Config) -> None:
    async with web_client(config) as client:
        for path in ("/login", "/api/nothing", "/healthz"):
            headers = (await client.get(path)).headers
            assert "default-src 'self'" in headers["content-security-policy"]
            assert "frame-ancestors 'none'" in headers["content-security-policy"]
            assert headers["x-content-type-options"] == "nosniff"
            assert headers["referrer-policy"] == "same-origin"


async def test_unknown_api_route_is_404_envelope(config: Config) -> None:
    async with web_client(config) as client:
        await login(client)
        response = await client.get("/api/no/such/thing")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


async def test_anonymous_api_post_is_401_even_without_a_token(config: Config) -> None:
    async with web_client(config) as client:
        response = await client.post("/api/things", json={"name": "x"})
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "auth.required"


async def test_oversized_body_is_422_and_changes_nothing(config: Config) -> None:
    async with web_client(config) as client:
        await login(client)
        token = csrf_from((await client.get("/home")).text)
        response = await client.post(
            "/api/things",
            content=b'{"name": "' + b"x" * 70_000 + b'"}',
            headers={"X-CSRF-Token": token, "Content-Type": "application/json"},
        )
        assert response.status_code == 422
        assert "body" in response.json()["error"]["fields"]
        assert (await client.get("/api/things")).json()["data"] == {"things": []}


def legacy_scrypt_hash(password: str) -> str:
    """A hash as mega-py wrote it before Argon2: `scrypt$n$r$p$salt_b64$hash_b64`."""
    salt = b"0123456789abcdef"
    digest = hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1, dklen=32)
    return "$".join(
        [
            "scrypt",
            "16384",
            "8",
            "1",
            base64.b64encode(salt).decode(),
            base64.b64encode(digest).decode(),
        ]
    )


async def test_an_old_scrypt_hash_logs_in_and_is_upgraded_to_argon2(config: Config) -> None:
    async with web_client(config) as client:
        db = client.app.state.ctx.db

        def set_hash(session: Session) -> None:
            user = session.scalar(select(User).where(User.username == DEMO_USER))
            assert user is not None
            user.password_hash = legacy_scrypt_hash(DEMO_PASSWORD)

        def stored_hash(session: Session) -> str | None:
            return session.scalar(select(User.password_hash).where(User.username == DEMO_USER))

        await db.run(set_hash)
        assert (await login(client, DEMO_USER, "wrong")).status_code == 401
        assert (await db.run(stored_hash)).startswith("scrypt$")  # a failed login changes nothing
        assert (await login(client)).status_code == 303
        upgraded = await db.run(stored_hash)
        assert upgraded.startswith("$argon2id$")
        assert verify_password(DEMO_PASSWORD, upgraded) and not verify_password("x", upgraded)


def test_hashes_in_no_known_format_never_match() -> None:
    assert not verify_password("pw", "md5$abc")
    assert not verify_password("pw", "scrypt$broken")
    assert hash_password("pw").startswith("$argon2id$")


async def test_the_framework_renders_a_login_page_without_app_templates(config: Config) -> None:
    async with web_client(config) as client:
        page = await client.get("/login")
        assert page.status_code == 200
        assert '<form method="post" action="/login">' in page.text
        assert csrf_from(page.text) and 'name="next" value="/home"' in page.text


@pytest.mark.parametrize("cookie", ["mega_session", "mega_csrf"])
async def test_a_malformed_cookie_is_treated_as_absent(config: Config, cookie: str) -> None:
    async with web_client(config) as client:
        for value in (
            "\u00fcn\u00efcode.x".encode("latin-1"),
            b"no-dot-at-all",
            b"a.b.c",
            b"x" * 500,
        ):
            raw = {
                b"cookie": cookie.encode() + b"=" + value
            }  # httpx types a bytes value by a bytes name
            page = await client.get("/login", headers=raw)
            assert page.status_code == 200, value  # never a 500
            assert "content-security-policy" in page.headers
            assert (await client.get("/api/things", headers=raw)).status_code == 401
        assert (await login(client)).status_code == 303  # and logging in still works


async def test_no_page_or_answer_is_cached_and_head_is_allowed(config: Config) -> None:
    async with web_client(config) as client:
        for path in ("/login", "/healthz", "/api/things"):
            assert (await client.get(path)).headers["cache-control"] == "no-store", path
        await login(client)
        assert (await client.get("/home")).headers["cache-control"] == "no-store"
        for path in ("/healthz", "/readyz", "/login"):
            head = await client.head(path)
            assert head.status_code in (200, 303) and head.content == b"", path


def chunks(total: int, piece: int = 16 * 1024) -> Any:
    """A body without Content-Length (chunked), and how much of it the app pulled."""

    async def body() -> AsyncIterator[bytes]:
        sent = 0
        while sent < total:
            chunks.pulled = sent = sent + piece  # type: ignore[attr-defined]
            yield b"x" * piece

    chunks.pulled = 0  # type: ignore[attr-defined]
    return body()


async def test_a_chunked_body_is_stopped_at_the_limit_not_read_in_full(config: Config) -> None:
    async with web_client(config) as client:
        # Anonymous on /api: 401 before a byte of the body is read.
        anonymous = await client.post("/api/things", content=chunks(50 * 1024 * 1024))
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["code"] == "auth.required"
        # The login form: 422 once 64 KiB have arrived, the rest never pulled.
        big = await client.post(
            "/login",
            content=chunks(50 * 1024 * 1024),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert big.status_code == 422 and "body" in big.json()["error"]["fields"]
        assert chunks.pulled <= 128 * 1024  # type: ignore[attr-defined]
        # Logged in: the same for a JSON route, and nothing is changed.
        await login(client)
        token = csrf_from((await client.get("/home")).text)
        response = await client.post(
            "/api/things",
            content=chunks(10 * 1024 * 1024),
            headers={"X-CSRF-Token": token, "Content-Type": "application/json"},
        )
        assert response.status_code == 422 and "body" in response.json()["error"]["fields"]
        assert chunks.pulled <= 128 * 1024  # type: ignore[attr-defined]
        assert (await client.get("/api/things")).json()["data"] == {"things": []}


async def test_anonymous_bad_json_on_the_api_is_401_not_422(config: Config) -> None:
    async with web_client(config) as client:
        response = await client.post(
            "/api/things", content=b"{not json", headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 401


@pytest.mark.parametrize(
    "body",
    [b'{"name": "\xff\xfe"}', b"[" * 5000 + b"]" * 5000, b'{"a":' * 3000 + b"1" + b"}" * 3000],
)
async def test_invalid_utf8_and_over_deep_json_are_422_and_change_nothing(
    config: Config, body: bytes
) -> None:
    async with web_client(config) as client:
        await login(client)
        token = csrf_from((await client.get("/home")).text)
        headers = {"X-CSRF-Token": token, "Content-Type": "application/json"}
        response = await client.post("/api/things", content=body, headers=headers)
        assert response.status_code == 422
        error = response.json()["error"]
        assert error["code"] == "validation_failed" and "not valid JSON" in error["fields"]["body"]
        assert (await client.get("/api/things")).json()["data"] == {"things": []}


async def test_a_flash_is_shown_once_escaped_and_cannot_be_forged(config: Config) -> None:
    async with web_client(config) as client:
        await login(client)
        token = csrf_from((await client.get("/home")).text)
        posted = await client.post("/home/note", data={"csrf_token": token})
        assert posted.status_code == 303 and "mega_flash=" in posted.headers["set-cookie"]
        shown = await client.get("/home")
        assert "Noted &lt;b&gt;once&lt;/b&gt;." in shown.text
        assert "mega_flash=" in shown.headers["set-cookie"]  # cleared as it is shown
        assert "Noted" not in (await client.get("/home")).text
        client.cookies.set("mega_flash", "WW91IGFyZSBsb2NrZWQ.forged")  # unsigned text
        assert 'role="status"' not in (await client.get("/home")).text


# ---- over-long fields: the form, with a sentence at the field --------------------------------


@pytest.mark.parametrize(
    "field,value,sentence",
    [
        ("username", "u" * 201, "Username must be at most 200 characters."),
        ("password", "p" * 1001, "Password must be at most 1000 characters."),
    ],
)
async def test_an_over_long_field_answers_the_form_with_a_sentence(
    config: Config, field: str, value: str, sentence: str
) -> None:
    async with web_client(config) as client:
        token = csrf_from((await client.get("/login")).text)
        form = {"username": DEMO_USER, "password": DEMO_PASSWORD, "csrf_token": token}
        response = await client.post("/login", data={**form, field: value})
        assert response.status_code == 422
        assert response.headers["content-type"].startswith("text/html")
        assert f'<p id="error-{field}">{sentence}</p>' in response.text
        assert '<form method="post" action="/login">' in response.text
        assert '"ok"' not in response.text and SESSION_COOKIE not in str(response.headers)
        # Nothing changed: no failure counted (three in a row would lock the pair here).
        db = client.app.state.ctx.db
        assert await db.run(lambda s: s.scalars(select(LoginFailure)).all()) == []
        ok = await client.post("/login", data={**form, "csrf_token": csrf_from(response.text)})
        assert ok.status_code == 303


# ---- one normal form of a username, for the lookup and every limit ---------------------------


@pytest.mark.parametrize(
    "typed,normal",
    [
        ("demo", "demo"),
        (" demo", "demo"),
        ("demo\n", "demo"),
        ("\xa0demo", "demo"),
        ("\uff44\uff45\uff4d\uff4f", "demo"),
        ("\u3000demo\u2002", "demo"),
        ("Demo", "Demo"),
        ("de mo", "de mo"),
        ("\ufb01le", "file"),
    ],
)
def test_a_username_has_one_normal_form(typed: str, normal: str) -> None:
    assert normalise_username(typed) == normal


async def test_users_are_stored_and_looked_up_by_their_normal_form(config: Config) -> None:
    async with web_client(config) as client:
        db = client.app.state.ctx.db
        await asyncio.to_thread(ensure_user, db, " \uff4eew ", "new-password")
        names = await db.run(lambda s: s.scalars(select(User.username)).all())
        assert sorted(names) == [DEMO_USER, "new"]
        assert (await login(client, "New", "new-password")).status_code == 401  # case counts
        assert (await login(client, "new\n", "new-password")).status_code == 303


# ---- the account's limit and the device cookie -----------------------------------------------


@pytest.fixture
def account_config(tmp_path: Path, nats_url: str, redis_url: str) -> Config:
    return config_for(
        tmp_path, nats_url, redis_url, login_account_max_failures=3, login_max_failures=2
    )


async def test_a_login_leaves_a_signed_device_cookie_that_logout_keeps(
    account_config: Config,
) -> None:
    async with web_client(account_config) as client:
        response = await login(client)
        cookies = response.headers.get_list("set-cookie")
        device = next(c for c in cookies if c.startswith(f"{DEVICE_COOKIE}="))
        assert "HttpOnly" in device and "SameSite=lax" in device and "Path=/" in device
        assert f"Max-Age={30 * 24 * 3600}" in device and "Secure" not in device  # plain http
        value = client.cookies[DEVICE_COOKIE]
        assert device_username(value, TEST_SECRET, 60) == DEMO_USER
        assert client.cookies[SESSION_COOKIE] not in value  # nothing of the session
        token = csrf_from((await client.get("/home")).text)
        logout = await client.post("/logout", data={"csrf_token": token})
        assert DEVICE_COOKIE not in logout.headers.get("set-cookie", "")
        assert client.cookies[DEVICE_COOKIE] == value


def test_a_device_cookie_is_only_good_signed_with_the_secret_and_unaltered() -> None:
    cookie = device_cookie("demo", TEST_SECRET)
    assert device_username(cookie, TEST_SECRET, 60) == "demo"
    assert device_username(cookie, "another-secret-0123456789abcdef012345", 60) is None
    assert device_username(cookie[:-2] + "xx", TEST_SECRET, 60) is None
    assert device_username(sign("demo", TEST_SECRET), TEST_SECRET, 60) is None  # another salt
    assert device_username(None, TEST_SECRET, 60) is None
    assert device_username("not-a-cookie", TEST_SECRET, 60) is None


async def test_the_device_cookie_lifts_the_account_limit_only(account_config: Config) -> None:
    async with web_client(account_config) as owner:
        assert (await login(owner)).status_code == 303  # the owner's browser, before the attack
        device = owner.cookies[DEVICE_COOKIE]
        owner.cookies.delete(SESSION_COOKIE)
        for n in range(3):  # three addresses, one failure each: the account's limit here
            async with from_ip(owner, f"10.0.0.{n}") as attacker:
                assert (await login(attacker, DEMO_USER, "wrong")).status_code == 401
        async with from_ip(owner, "10.0.1.1") as fresh:
            refused = await login(fresh)  # the right password, from an address with no failure
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 3500
            assert "Too many attempts. Try again in 60 minutes." in refused.text
            fresh.cookies.set(DEVICE_COOKIE, device_cookie("someone-else", TEST_SECRET))
            assert (await login(fresh)).status_code == 429  # a cookie for another name
            fresh.cookies.set(DEVICE_COOKIE, device)
            assert (await login(fresh)).status_code == 303  # the cookie counts, not the address
        assert (await login(owner)).status_code == 303  # its own browser: exempt
        owner.cookies.delete(SESSION_COOKIE)
        # Not from the pair's limit: two failures from the owner's browser lock it there.
        for _ in range(2):
            assert (await login(owner, DEMO_USER, "wrong")).status_code == 401
        assert device_username(owner.cookies[DEVICE_COOKIE], TEST_SECRET, 60) == DEMO_USER
        assert (await login(owner)).status_code == 429


async def test_over_https_the_device_cookie_is_secure(account_config: Config) -> None:
    async with web_client(account_config) as client:
        transport = httpx.ASGITransport(app=client.app, client=("10.3.3.3", 4444))
        async with httpx.AsyncClient(transport=transport, base_url="https://testserver") as tls:
            cookies = (await login(tls)).headers.get_list("set-cookie")
            device = next(c for c in cookies if c.startswith(f"{DEVICE_COOKIE}="))
            assert "Secure" in device and "HttpOnly" in device


async def test_an_expired_device_cookie_exempts_nothing(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    config = config_for(
        tmp_path, nats_url, redis_url, login_account_max_failures=1, device_cookie_max_age_s=1
    )
    async with web_client(config) as owner:
        assert (await login(owner)).status_code == 303
        owner.cookies.delete(SESSION_COOKIE)
        async with from_ip(owner, "10.0.0.9") as attacker:
            assert (await login(attacker, DEMO_USER, "wrong")).status_code == 401
        deadline = time.monotonic() + 5  # issue times are whole seconds: 1 to 2 s from now
        while device_username(owner.cookies[DEVICE_COOKIE], TEST_SECRET, 1) is not None:
            assert time.monotonic() < deadline, "the device cookie never expired"
            await asyncio.sleep(0.1)
        assert (await login(owner)).status_code == 429


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers (the test runner owns the signals)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@asynccontextmanager
async def served(app: Any) -> AsyncIterator[str]:
    """`app` behind a real uvicorn on 127.0.0.1, configured as `mega start` serves it: the client
    IP is the socket's peer address (forwarded headers are trusted from 127.0.0.1 only)."""
    port = free_port()
    server = _Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
            proxy_headers=True,
        )
    )
    serving = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and not serving.done(), "uvicorn did not start"
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await serving


def from_address(url: str, ip: str) -> httpx.AsyncClient:
    """A client whose socket is bound to `ip` (any 127.0.0.x reaches a server on 127.0.0.1).
    A connection per request: one kept alive while the other addresses take their turns can
    pass uvicorn's 5 s keep-alive, and a request sent as the server closes it fails."""
    transport = httpx.AsyncHTTPTransport(
        local_address=ip, limits=httpx.Limits(max_keepalive_connections=0)
    )
    return httpx.AsyncClient(transport=transport, base_url=url)


async def fail_in_rounds(url: str, addresses: list[str], rounds: int = 5) -> list[list[int]]:
    """`rounds` wrong passwords for `demo` from each address, one address after the other in
    each round; a try refused for its pair's delay (which doubles after the second failure) is
    made again once its Retry-After has passed. The statuses of the tries that counted."""
    statuses: list[list[int]] = [[] for _ in addresses]
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(from_address(url, ip)) for ip in addresses]
        for _ in range(rounds):
            for client, seen in zip(clients, statuses, strict=True):
                while True:
                    response = await login(client, DEMO_USER, "wrong")
                    wait = int(response.headers.get("retry-after", "0"))
                    if response.status_code != 429 or wait > MAX_LOGIN_DELAY_S:
                        break
                    await asyncio.sleep(wait)  # the pair's delay, not a lock
                seen.append(response.status_code)
    return statuses


async def test_many_addresses_cannot_guess_past_the_account_limit_but_its_owner_can_log_in(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    """The defaults (5 per pair and 50 per IP in 15 min, 100 per account an hour), through a
    real server and real loopback addresses: 105 wrong passwords from 21 addresses."""
    config = config_for(tmp_path, nats_url, redis_url)
    async with (
        web_client(config) as app_client,
        served(app_client.app) as url,
        from_address(url, "127.0.0.100") as owner,
    ):
        assert (await login(owner)).status_code == 303  # logged in here before
        owner.cookies.delete(SESSION_COOKIE)
        attackers = [f"127.0.0.{n}" for n in range(2, 22)]
        started = time.monotonic()
        # 100 failures, 5 per (user, IP), then 5 more tries from a 21st address: refused.
        assert await fail_in_rounds(url, attackers) == [[401] * 5] * 20
        assert await fail_in_rounds(url, ["127.0.0.22"]) == [[429] * 5]
        for n, name in enumerate([DEMO_USER, " demo", "demo\n", "\xa0demo", "\uff44emo"]):
            async with from_address(url, f"127.0.0.{30 + n}") as fresh:
                refused = await login(fresh, name, DEMO_PASSWORD)
                assert refused.status_code == 429, repr(name)
                # Until the first failure is an hour old (the window of the account's limit).
                retry_after = int(refused.headers["retry-after"])
                assert 3600 - (time.monotonic() - started) - 1 <= retry_after <= 3600
                minutes = math.ceil(retry_after / 60)
                assert f"Too many attempts. Try again in {minutes} minutes." in refused.text
        assert (await login(owner)).status_code == 303  # its device cookie exempts it
