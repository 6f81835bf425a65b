"""The URLs of a Redis server, as a `redis` bus and a cache name them: one server
(`redis://`, `rediss://` over TLS, `unix://`), a Redis Cluster (`redis+cluster://`) or a primary
under Sentinel (`redis+sentinel://`). Plain functions: the config checks its URLs with them
before any client is imported."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from mega.drivers.urls import check_url, one_url

# A Redis Cluster, named by some of its nodes (one is enough; more in case that one is down):
# `redis+cluster://[user:password@]host:port[,host:port...]`, `rediss+cluster://` over TLS.
REDIS_CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
# A primary with replicas under Redis Sentinel, named by its sentinels and the name they
# monitor it by: `redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]`,
# `rediss+sentinel://` when the primary and replicas speak TLS.
REDIS_SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")


@dataclass(frozen=True)
class RedisClusterUrl:
    """A `redis+cluster://` URL read: the nodes to ask for the cluster's map, the credentials
    (None: none), and whether to speak TLS."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    tls: bool


@dataclass(frozen=True)
class RedisSentinelUrl:
    """A `redis+sentinel://` URL read: the sentinels to ask where the primary is, the name
    they monitor it by, its database, the primary's credentials (None: none; the sentinels
    are asked without) and whether the primary speaks TLS."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None
    tls: bool


def read_redis_cluster_url(url: str) -> RedisClusterUrl:
    """The parts of a `redis+cluster://` URL; ValueError saying what is wrong with it."""
    parts = urlsplit(url)
    expected = "expected redis+cluster://host:port[,host:port...], rediss+cluster:// over TLS"
    if parts.scheme not in REDIS_CLUSTER_SCHEMES:
        raise ValueError(f"bad URL {url!r} ({expected})")
    if parts.path not in ("", "/", "/0") or parts.query or parts.fragment:
        raise ValueError(
            f"bad URL {url!r}: a Redis Cluster has one database and takes no options ({expected})"
        )
    return RedisClusterUrl(
        _read_nodes(url, expected),
        unquote(parts.username) if parts.username else None,
        unquote(parts.password) if parts.password is not None else None,
        tls=parts.scheme == "rediss+cluster",
    )


def read_redis_sentinel_url(url: str) -> RedisSentinelUrl:
    """The parts of a `redis+sentinel://` URL; ValueError saying what is wrong with it."""
    parts = urlsplit(url)
    expected = (
        "expected redis+sentinel://host:port[,host:port...]/service[/db], "
        "rediss+sentinel:// over TLS"
    )
    if parts.scheme not in REDIS_SENTINEL_SCHEMES:
        raise ValueError(f"bad URL {url!r} ({expected})")
    service, _, db = parts.path.strip("/").partition("/")
    if not service or not (db == "" or db.isdigit()) or parts.query or parts.fragment:
        raise ValueError(
            f"bad URL {url!r}: the path names the primary as the sentinels monitor it, then "
            f"optionally its database number, and takes no options ({expected})"
        )
    return RedisSentinelUrl(
        _read_nodes(url, expected),
        unquote(service),
        int(db or 0),
        unquote(parts.username) if parts.username else None,
        unquote(parts.password) if parts.password is not None else None,
        tls=parts.scheme == "rediss+sentinel",
    )


def _read_nodes(url: str, expected: str) -> tuple[tuple[str, int], ...]:
    """The host:port list between a URL's credentials and its path."""
    nodes = []
    for node in urlsplit(url).netloc.rpartition("@")[2].split(","):
        host, _, port = node.strip().rpartition(":")
        if not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad URL {url!r}: {node.strip()!r} is not host:port ({expected})")
        nodes.append((host.strip("[]"), int(port)))
    return tuple(nodes)


def check_redis_url(url: str) -> str:
    """`url` when it names a Redis server, Cluster or Sentinel service; ValueError otherwise."""
    scheme = urlsplit(url).scheme
    if scheme in REDIS_CLUSTER_SCHEMES:
        read_redis_cluster_url(url)
        return url
    if scheme in REDIS_SENTINEL_SCHEMES:
        read_redis_sentinel_url(url)
        return url
    return check_url(url, "redis", "rediss", "unix")


def check_urls(urls: list[str]) -> str:
    """A redis bus's URL: one server, or one multi-node URL whose commas list the nodes."""
    if urlsplit(urls[0]).scheme in (*REDIS_CLUSTER_SCHEMES, *REDIS_SENTINEL_SCHEMES):
        return check_redis_url(",".join(urls))
    return check_redis_url(one_url("redis", urls))
