"""The `nats` bus driver: NATS JetStream. See bus.py (streams, publishing), receiver.py (pull
requests and settling), names.py (what lives where), urls.py (the URLs a config may give) and
embedded.py (the nats-server of mega dev and the tests).

`NatsBus` is imported on first use: a config's URLs are checked (urls.py) without nats-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mega.drivers.nats.urls import check_urls

if TYPE_CHECKING:
    from mega.drivers.nats.bus import NatsBus

__all__ = ["NatsBus", "check_urls"]


def __getattr__(name: str) -> Any:
    if name == "NatsBus":
        from mega.drivers.nats.bus import NatsBus

        return NatsBus
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
