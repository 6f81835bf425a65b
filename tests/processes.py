"""Process helpers for tests that run real hosts: who is below a pid, who is alive, free ports,
a host started with its clock set off."""

from __future__ import annotations

import os
import random
import re
import socket
import struct
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

# libfaketime's preload library as Debian's `faketime` package installs it, in its thread-safe
# build: a host runs threads beside its event loop (the metrics server, asyncio.to_thread).
FAKETIME_LIBRARY = (
    Path("/usr/lib") / (sysconfig.get_config_var("MULTIARCH") or "") / "faketime/libfaketimeMT.so.1"
)


def unmeasured_env() -> dict[str, str]:
    """This process's environment without coverage's variables: a host started with it runs
    unmeasured. For the hosts the fault tests SIGKILL (a process killed so never writes its
    coverage data: tracing it was CPU spent for nothing, on two cores the whole suite shares)
    and the browser tests' live stacks (what their pages do is measured in process, by
    tests/app and tests/mega/web)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_")}


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def tcp_peers(pid: int) -> set[tuple[str, int]]:
    """The (address, port) at the far end of every established IPv4 TCP connection of `pid`:
    its sockets (/proc/<pid>/fd) looked up in its network namespace's table (/proc/<pid>/net)."""
    sockets = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            sockets.add(target[len("socket:[") : -1])
    peers = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()  # sl local remote state ... inode (the tenth)
        if fields[3] == "01" and fields[9] in sockets:  # 01: ESTABLISHED
            address, port = fields[2].split(":")
            # The address is the kernel's 32-bit word in this machine's byte order.
            peers.add((socket.inet_ntoa(struct.pack("=I", int(address, 16))), int(port, 16)))
    return peers


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# Bases are drawn below the kernel's ephemeral ports (32768 and up by default), which it hands
# to every outgoing connection and every bind to port 0: a base + offset drawn from them could
# be taken by another test's connection between this check and the host's bind (a CI run saw
# `mega work` refused its metrics port so).
LOW_PORTS_FROM = 10_000


def _ephemeral_from() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port_base(*offsets: int) -> int:
    """A port `base` such that base + every offset is free right now and outside the ports the
    kernel hands out by itself (for tools that derive ports from a base: honcho's +100 per
    process, supervisord's + process number)."""
    highest = _ephemeral_from() - 1 - max(offsets, default=0)
    for _ in range(200):
        base = random.randrange(LOW_PORTS_FROM, highest)
        if all(_bindable(base + o) for o in {0, *offsets}):
            return base
    raise RuntimeError(f"no free port base for offsets {offsets}")


def http_status(url: str) -> int | None:
    """The HTTP status of GET `url`, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def wait_for_status(
    url: str, status: int, timeout_s: float, *, while_alive: int, logs: Callable[[], str]
) -> None:
    """Poll `url` until it answers `status`; fail early when process `while_alive` exits.
    `logs` tells what the processes said, for the failure message."""
    deadline = time.monotonic() + timeout_s
    last: int | None = None
    while time.monotonic() < deadline:
        last = http_status(url)
        if last == status:
            return
        if not alive(while_alive):
            raise AssertionError(f"{while_alive} exited before {url} answered {status}\n{logs()}")
        time.sleep(0.2)
    raise AssertionError(f"{url} answered {last}, not {status}, in {timeout_s} s\n{logs()}")


def wait_for_text(
    read: Callable[[], str], pattern: str, count: int, timeout_s: float, *, while_alive: int
) -> None:
    """Poll `read()` until `pattern` occurs `count` times (e.g. one "ready" log line per host)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(re.findall(pattern, read())) >= count:
            return
        if not alive(while_alive):
            break
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} did not appear {count} time(s)\n{read()[-4000:]}")


def clock_offset_env(offset_s: float) -> dict[str, str]:
    """Environment variables that start a process with its wall clock `offset_s` seconds off
    (libfaketime: `time.time()` and `datetime.now()` are shifted; the monotonic clock is left
    alone, so asyncio's sleeps and timeouts stay real). Skips the test without libfaketime."""
    if not FAKETIME_LIBRARY.exists():
        pytest.skip(f"libfaketime is not installed ({FAKETIME_LIBRARY}): apt-get install faketime")
    return {
        "LD_PRELOAD": str(FAKETIME_LIBRARY),
        "FAKETIME": f"{offset_s:+}",  # seconds; "." is the decimal point (C numeric locale)
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
