"""A memory bus needs no URL; one given is kept and unused."""

from __future__ import annotations

from mega.drivers.urls import one_url


def check_urls(urls: list[str]) -> str:
    return one_url("memory", urls)
