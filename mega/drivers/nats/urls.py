"""A nats bus's URLs: `nats://` or `tls://`, several for a cluster."""

from __future__ import annotations

from mega.drivers.urls import check_url


def check_urls(urls: list[str]) -> str:
    """Every URL nats:// or tls://, joined by commas as NATS_URL carries them."""
    return ",".join(check_url(url, "nats", "tls") for url in urls)
