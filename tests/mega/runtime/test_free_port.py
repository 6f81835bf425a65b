"""free_port picks below the kernel's range for outgoing connections, and skips a port in use."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from mega.drivers.embedded import LISTEN_PORTS, free_port


def ephemeral_range() -> range:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return range(int(low), int(high) + 1)


def test_a_free_port_is_outside_the_range_of_outgoing_connections_and_can_be_bound() -> None:
    ports = {free_port() for _ in range(50)}
    assert ports <= set(LISTEN_PORTS)
    assert not ports & set(ephemeral_range())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.pop()))  # still free


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        with socket.socket() as other:
            other.bind(("127.0.0.1", 0))
            free = other.getsockname()[1]
        picks = iter([taken, taken, free])
        monkeypatch.setattr(random, "choice", lambda _ports: next(picks))
        assert free_port() == free
