"""Boot-time validation: a wrong config fails with a message that names the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from mega.config import load_config
from mega.errors import ConfigError

GOOD = """
services = {
    "caches": {"main": {"driver": "redis", "url": "redis://127.0.0.1:6379/0"}},
    "locks": {"main": {"driver": "redlock", "caches": ["main"]}},
    "buses": {"jobs": {"driver": "nats", "url": "nats://127.0.0.1:4222"}},
}
auth = {"secret_key": "x" * 40}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.py"
    path.write_text(text)
    return path


def test_good_config_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_MAIN_URL", raising=False)
    config = load_config(write(tmp_path, GOOD))
    assert config.caches == {"main": "redis://127.0.0.1:6379/0"}
    assert config.locks == {"main": ["main"]}
    assert config.database_url.startswith("sqlite:///") and config.database_url.endswith(
        "var/mega.db"
    )
    assert config.auth.demo_user is None  # outside dev there is no default login


def test_per_alias_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_MAIN_URL", "redis://cache.internal:6380/1")
    monkeypatch.setenv("NATS_JOBS_URL", "nats://bus.internal:4223")
    config = load_config(write(tmp_path, GOOD))
    assert config.caches["main"] == "redis://cache.internal:6380/1"
    assert config.buses["jobs"] == "nats://bus.internal:4223"


@pytest.mark.parametrize(
    "replace,expected",
    [
        ('"driver": "redis"', "services.caches.main.driver: unknown driver 'memcached'"),
        ('"caches": ["main"]', "services.locks.main.caches: 'nope' names no cache"),
        ('"nats://127.0.0.1:4222"', "services.buses.jobs.url: bad URL 'localhost:4222'"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, replace: str, expected: str) -> None:
    wrong = {
        '"driver": "redis"': '"driver": "memcached"',
        '"caches": ["main"]': '"caches": ["nope"]',
        '"nats://127.0.0.1:4222"': '"localhost:4222"',
    }[replace]
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, GOOD.replace(replace, wrong)))
    assert expected in str(info.value)


def test_secret_key_required_outside_dev(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEGA_SECRET_KEY", raising=False)
    path = write(tmp_path, GOOD.replace('auth = {"secret_key": "x" * 40}', ""))
    with pytest.raises(ConfigError, match="MEGA_SECRET_KEY: required outside dev"):
        load_config(path, dev=False)
    dev = load_config(path, dev=True)
    assert (dev.auth.demo_user, dev.auth.demo_password) == ("demo", "demo")


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.py")
