"""The `nats` bus driver: NATS JetStream. See bus.py (streams, publishing, dead letters),
receiver.py (pull requests and settling) and names.py (what lives where)."""

from mega.drivers.nats.bus import NatsBus

__all__ = ["NatsBus"]
