"""A postgres bus's URL: one postgresql://, or none for the application's database."""

from __future__ import annotations

from mega.drivers.urls import check_url, one_url


def check_urls(urls: list[str]) -> str:
    url = one_url("postgres", urls)
    return check_url(url, "postgresql", "postgres") if url else url
