"""Boot-time validation: a wrong config fails with a message that names the key."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mega.config import load_config
from mega.drivers.redis.urls import (
    RedisClusterUrl,
    RedisSentinelUrl,
    read_redis_cluster_url,
    read_redis_sentinel_url,
)
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
    assert config.auth.users == {}  # the framework seeds no login of its own
    assert config.auth.landing_path == "/"


def test_per_alias_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_MAIN_URL", "redis://cache.internal:6380/1")
    monkeypatch.setenv("NATS_JOBS_URL", "nats://bus.internal:4223")
    config = load_config(write(tmp_path, GOOD))
    assert config.caches["main"] == "redis://cache.internal:6380/1"
    assert config.buses["jobs"].url == "nats://bus.internal:4223"


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
    assert dev.auth.secret_key and dev.auth.users == {}


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.py")


def test_every_problem_is_named_at_once(tmp_path: Path) -> None:
    text = GOOD.replace('"driver": "nats"', '"driver": "kafka"').replace(
        'auth = {"secret_key": "x" * 40}',
        'auth = {"secret_key": "x" * 40, "login_max_failures": True, "sessions": 1}\n'
        'metrics = {"enabled": "yes", "worker_port": 70000}',
    )
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    problems = str(info.value).split("; ")
    assert [p.split(":")[0] for p in problems] == [
        "services.buses.jobs.driver",
        "auth.login_max_failures",  # a bool is not a count
        "auth.sessions",
        "metrics.enabled",
        "metrics.worker_port",
    ]
    assert "auth.sessions: unknown key" in problems


@pytest.mark.parametrize(
    ("auth", "expected"),
    [
        ('{"landing_path": "//evil.example"}', "auth.landing_path"),
        ('{"users": {"": "pw"}}', "auth.users"),
        ('"not a dict"', "auth: "),
    ],
)
def test_bad_auth_options(tmp_path: Path, auth: str, expected: str) -> None:
    text = GOOD.replace('auth = {"secret_key": "x" * 40}', f"auth = {auth}")
    with pytest.raises(ConfigError, match=expected):
        load_config(write(tmp_path, text), dev=True)


def test_users_and_landing_path(tmp_path: Path) -> None:
    text = GOOD.replace(
        'auth = {"secret_key": "x" * 40}',
        'auth = {"secret_key": "x" * 40, "users": {"ada": "pw"}, "landing_path": "/home"}',
    )
    config = load_config(write(tmp_path, text))
    assert (config.auth.users, config.auth.landing_path) == ({"ada": "pw"}, "/home")


def test_metrics_bind_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_config(write(tmp_path, GOOD)).metrics.bind == "0.0.0.0"
    monkeypatch.setenv("MEGA_METRICS_BIND", "127.0.0.1")
    assert load_config(write(tmp_path, GOOD)).metrics.bind == "127.0.0.1"


@pytest.mark.parametrize(
    "url", ['"nats://a:4222,nats://b:4222, nats://c:4222"', '["nats://a:4222", "nats://b:4222"]']
)
def test_a_nats_bus_takes_the_urls_of_a_cluster(tmp_path: Path, url: str) -> None:
    text = GOOD.replace('"nats://127.0.0.1:4222"}', f'{url}, "replicas": 3}}')
    config = load_config(write(tmp_path, text))
    assert str(config.buses["jobs"].url).split(",")[:2] == ["nats://a:4222", "nats://b:4222"]
    assert config.buses["jobs"].replicas == 3


@pytest.mark.parametrize(
    "bus,expected",
    [
        ('"nats", "url": "nats://a:4222,http://b:1"', "bad URL 'http://b:1'"),
        ('"redis", "url": "redis://a:6379,redis://b:6379"', "one URL for a redis bus, got 2"),
        ('"nats", "url": "nats://a:4222", "replicas": 6', "replicas"),
    ],
)
def test_bad_bus_urls_and_replicas_name_the_key(tmp_path: Path, bus: str, expected: str) -> None:
    text = GOOD.replace('"nats", "url": "nats://127.0.0.1:4222"', bus)
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert "services.buses.jobs" in str(info.value) and expected in str(info.value)


CLUSTER_FORM = "redis+cluster://host:port[,host:port...]"
SENTINEL_FORM = "redis+sentinel://host:port[,host:port...]/service[/db]"


def test_a_redis_cluster_url_is_read_for_a_cache_and_a_bus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_MAIN_URL", raising=False)
    monkeypatch.delenv("NATS_JOBS_URL", raising=False)
    url = "redis+cluster://ops:s%40cret@10.0.0.1:7000, [::1]:7001"
    text = GOOD.replace('"redis://127.0.0.1:6379/0"', repr(url)).replace(
        '"nats", "url": "nats://127.0.0.1:4222"', f'"redis", "url": {url!r}'
    )
    config = load_config(write(tmp_path, text))
    assert config.caches["main"] == url
    assert config.buses["jobs"].url == "redis+cluster://ops:s%40cret@10.0.0.1:7000,[::1]:7001"
    assert read_redis_cluster_url(url) == RedisClusterUrl(
        (("10.0.0.1", 7000), ("::1", 7001)), "ops", "s@cret", tls=False
    )
    assert read_redis_cluster_url("rediss+cluster://h:1/").tls is True


def test_a_redis_sentinel_url_is_read_for_a_cache_and_a_bus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_MAIN_URL", raising=False)
    monkeypatch.delenv("NATS_JOBS_URL", raising=False)
    url = "redis+sentinel://:s%40cret@10.0.0.1:26379, 10.0.0.2:26379/mega/2"
    text = GOOD.replace('"redis://127.0.0.1:6379/0"', repr(url)).replace(
        '"nats", "url": "nats://127.0.0.1:4222"', f'"redis", "url": {url!r}'
    )
    config = load_config(write(tmp_path, text))
    assert config.caches["main"] == url
    assert config.buses["jobs"].url == url.replace(", ", ",")
    assert read_redis_sentinel_url(url) == RedisSentinelUrl(
        sentinels=(("10.0.0.1", 26379), ("10.0.0.2", 26379)),
        service="mega",
        db=2,
        username=None,
        password="s@cret",
        tls=False,
    )
    assert read_redis_sentinel_url("rediss+sentinel://h:1/primary").tls is True
    assert read_redis_sentinel_url("redis+sentinel://h:1/primary").db == 0


@pytest.mark.parametrize(
    "url,expected,form",
    [
        ("redis+cluster://10.0.0.1", "'10.0.0.1' is not host:port", CLUSTER_FORM),
        ("redis+cluster://a:7000,,b:7001", "'' is not host:port", CLUSTER_FORM),
        (
            "redis+cluster://a:7000/1",
            "a Redis Cluster has one database and takes no options",
            CLUSTER_FORM,
        ),
        ("redis+cluster://a:7000?ssl=true", "takes no options", CLUSTER_FORM),
        ("redis+cluster://a:70000", "'a:70000' is not host:port", CLUSTER_FORM),
        ("redis+sentinel://10.0.0.1:26379", "the path names the primary", SENTINEL_FORM),
        ("redis+sentinel://10.0.0.1:26379/", "the path names the primary", SENTINEL_FORM),
        (
            "redis+sentinel://10.0.0.1:26379/mega/x",
            "then optionally its database number",
            SENTINEL_FORM,
        ),
        ("redis+sentinel://a:1/mega?ssl=true", "takes no options", SENTINEL_FORM),
        ("redis+sentinel://a,b:1/mega", "'a' is not host:port", SENTINEL_FORM),
    ],
)
def test_a_malformed_redis_cluster_or_sentinel_url_says_what_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, expected: str, form: str
) -> None:
    monkeypatch.delenv("REDIS_MAIN_URL", raising=False)
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, GOOD.replace('"redis://127.0.0.1:6379/0"', repr(url))))
    assert "services.caches.main.url" in str(info.value) and expected in str(info.value)
    assert form in str(info.value)


def test_hosts_that_sign_nothing_need_no_secret_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MEGA_SECRET_KEY", raising=False)
    monkeypatch.delenv("MEGA_ENV", raising=False)
    text = GOOD.replace('auth = {"secret_key": "x" * 40}', "auth = {}")
    with pytest.raises(ConfigError, match="MEGA_SECRET_KEY"):
        load_config(write(tmp_path, text))  # the web app signs cookies
    worker = load_config(write(tmp_path, text), signs=False)
    assert len(worker.auth.secret_key) == 64  # a throwaway the process never uses


def test_a_dev_env_beside_the_config_fills_unset_urls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NATS_URL", "")  # unset for the loader; restored after the test
    monkeypatch.setenv("REDIS_URL", "redis://mine:6379/0")
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "dev.env").write_text(
        "NATS_URL=nats://127.0.0.1:4999\nREDIS_URL=redis://127.0.0.1:6999/0\nOTHER=x\n"
    )
    text = GOOD.replace('"nats://127.0.0.1:4222"', 'os.environ["NATS_URL"]').replace(
        '"redis://127.0.0.1:6379/0"', 'os.environ["REDIS_URL"]'
    )
    config = load_config(write(tmp_path, "import os\n" + text))
    assert config.buses["jobs"].url == "nats://127.0.0.1:4999"  # unset: from mega dev's file
    assert config.caches["main"] == "redis://mine:6379/0"  # set: the environment wins
    assert "OTHER" not in os.environ


def test_a_config_builds_on_another_and_both_load_side_by_side(tmp_path: Path) -> None:
    """Each config file is imported under its own name, its folder importable: a staging config
    imports the main one's services and changes one URL, and each keeps its own."""
    (tmp_path / "mega_config.py").write_text(GOOD)
    (tmp_path / "staging_config.py").write_text(
        "from mega_config import auth, services\n"
        "services = {**services, 'buses': {'jobs': {'driver': 'nats',"
        " 'url': 'nats://staging:4222'}}}\n"
    )
    main = load_config(tmp_path / "mega_config.py")
    staging = load_config(tmp_path / "staging_config.py")
    assert main.module is not None and staging.module is not None
    assert (main.module.__name__, staging.module.__name__) == ("mega_config", "staging_config")
    assert str(main.buses["jobs"].url) == "nats://127.0.0.1:4222"
    assert str(staging.buses["jobs"].url) == "nats://staging:4222"
    assert staging.caches == main.caches  # the rest comes from the config it imported


def test_a_config_named_like_a_module_of_the_project_leaves_that_module_alone(
    tmp_path: Path,
) -> None:
    (tmp_path / "pytest.py").write_text(GOOD)  # "pytest" is taken, by a module no config made
    config = load_config(tmp_path / "pytest.py")
    assert config.module is not None
    assert config.module.__name__ == "mega_config_pytest"
    assert sys.modules["pytest"] is pytest
