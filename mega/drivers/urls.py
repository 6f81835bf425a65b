"""What every driver's URL check shares (each driver's own is `check_urls` in its package).

A config's `services.buses.<alias>.url` is checked when the config loads, by the `check_urls`
of the package that holds the alias's driver (mega.config.check_bus_urls finds it by the
driver's name, without importing the engine's client). A driver added by a package may define
one beside its Bus class; without one, a bus takes one URL of any form.
"""

from __future__ import annotations

from urllib.parse import urlsplit


def check_url(url: str, *schemes: str) -> str:
    """`url` when its scheme is one of `schemes` and it names a host (a unix socket a path);
    ValueError saying what was expected otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in schemes or not (parts.hostname or parts.scheme == "unix"):
        raise ValueError(f"bad URL {url!r} (expected {'/'.join(schemes)}://host:port)")
    return url


def one_url(driver: str, urls: list[str]) -> str:
    """The one URL of a bus whose engine is one server; ValueError for several."""
    if len(urls) > 1:
        raise ValueError(f"one URL for a {driver} bus, got {len(urls)}")
    return urls[0]


def check_urls(urls: list[str]) -> str:
    """Any one URL: the check of a driver that brings none."""
    return one_url("this", urls)
