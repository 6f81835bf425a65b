"""The heartbeat: /api/demo/ping round trips while the CPU pool hashes.

    .venv/bin/python -m bench.bench_heartbeat [--idle-s 5] [--pool-s 6] [--hash-s 3]

Starts EmbeddedNats and EmbeddedRedis in a temporary directory and the real web host as a
subprocess (`python -m mega start` with /work/main's mega_config.py, SQLite in the same
directory), logs in as the browser does (CSRF meta tag, form POST), then sends one GET
/api/demo/ping every 50 ms through three phases:

- idle: nothing else runs;
- pool: two concurrent `inline: false` hashes of about `--hash-s` seconds each, repeated for
  about `--pool-s` seconds, keep both pool processes busy;
- inline: one `inline: true` hash of about 2 s runs on the web event loop itself.

Hash rounds are calibrated first from short pool hashes (one alone, then a concurrent pair).
Target: pool p99 within 1.5x the idle p99, with no absolute floor. The inline phase
is the contrast: its max shows the event loop stalled for most of the hash. Takes about 30 s;
everything it starts is stopped at the end, on error too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run by path (python bench/x.py): make `app`, `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.workers.hash_tasks import MAX_ROUNDS
from bench.report import Result, ms, print_table, result, row, summary
from mega.drivers.embedded import free_port
from mega.drivers.nats.embedded import EmbeddedNats
from mega.drivers.redis.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "mega_config.py"
USER, PASSWORD = "bench", "bench-password"
SECRET_KEY = "bench-secret-key-" + "x" * 32  # 32+ characters, as outside dev
PING_INTERVAL_S = 0.05  # one heartbeat every 50 ms, as the demo page does
POOL_TARGET_FACTOR = 1.5  # pool p99 within this many times the idle p99
INLINE_HASH_S = 2.0  # how long the inline hash should block the loop
INLINE_MARGIN_S = 0.5  # pings before and after the inline hash
CALIBRATION_ROUNDS = 300_000
STARTUP_TIMEOUT_S = 60.0  # the web host must answer /readyz within this
STOP_TIMEOUT_S = 20.0  # after SIGTERM, how long the web host gets before SIGKILL
REQUEST_TIMEOUT_S = 60.0
LOG_TAIL_CHARS = 2000
CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]+)"')


def _csrf(html: str) -> str:
    match = CSRF_META.search(html)
    if match is None:
        raise RuntimeError("the page has no csrf-token meta tag")
    return match.group(1)


def _web_env(tmp: Path, nats_url: str, redis_url: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        # Per-alias URL overrides (REDIS_MAIN_URL, ...) or another config would escape the sandbox.
        if not (key.startswith(("REDIS_", "NATS_")) and key.endswith("_URL"))
        and key not in ("MEGA_CONFIG", "MEGA_ENV")
    }
    env.update(
        NATS_URL=nats_url,
        REDIS_URL=redis_url,
        DATABASE_URL=f"sqlite:///{tmp / 'bench.db'}",
        MEGA_SECRET_KEY=SECRET_KEY,
        MEGA_DEMO_USER=USER,
        MEGA_DEMO_PASSWORD=PASSWORD,
        MEGA_SCHEDULER_METRICS_PORT=str(free_port()),
        MEGA_WORKER_METRICS_PORT=str(free_port()),
    )
    return env


def _log_tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    return ""


def _stop_web(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the host drains its pool), then SIGKILL to its whole process group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # start_new_session made the host its group's leader: this reaches its pool too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def _wait_ready(client: httpx.AsyncClient, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"web host exited with {proc.returncode}:\n{_log_tail(log)}")
        with contextlib.suppress(httpx.TransportError):
            if (await client.get("/readyz")).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"web host not ready in {STARTUP_TIMEOUT_S} s:\n{_log_tail(log)}")
        await asyncio.sleep(0.1)


async def _login(client: httpx.AsyncClient) -> dict[str, str]:
    """Log in as the browser does; the headers JSON calls need (the session's CSRF token)."""
    token = _csrf((await client.get("/login")).text)
    form = {"username": USER, "password": PASSWORD, "csrf_token": token}
    await client.post("/login", data=form)
    page = await client.get("/demo")
    if page.status_code != 200 or page.url.path != "/demo":
        raise RuntimeError(f"login as {USER!r} failed (GET /demo -> {page.url})")
    return {"X-CSRF-Token": _csrf(page.text)}


async def _hash(
    client: httpx.AsyncClient, headers: dict[str, str], rounds: int, *, inline: bool
) -> float:
    """One hash through the JSON API; the server-side duration in ms."""
    body = {"input": "b", "rounds": rounds, "inline": inline}
    response = await client.post("/api/demo/worker/hash", json=body, headers=headers)
    if response.status_code != 200:
        raise RuntimeError(f"hash failed: {response.status_code} {response.text[:300]}")
    elapsed: float = response.json()["data"]["ms"]
    return elapsed


async def _pings_during(client: httpx.AsyncClient, load: Awaitable[Any]) -> list[float]:
    """Ping every PING_INTERVAL_S until `load` is done; the round trips in ms."""
    samples: list[float] = []

    async def sample() -> None:
        next_at = time.perf_counter()
        while True:
            started = time.perf_counter()
            (await client.get("/api/demo/ping")).raise_for_status()
            samples.append((time.perf_counter() - started) * 1000)
            # A slow ping is followed at once by the next one: no catching up in a burst.
            next_at = max(next_at + PING_INTERVAL_S, time.perf_counter())
            await asyncio.sleep(next_at - time.perf_counter())

    sampler = asyncio.create_task(sample())
    try:
        await load
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    return samples


async def _measure(
    base_url: str,
    proc: subprocess.Popen[bytes],
    log: Path,
    idle_s: float,
    pool_s: float,
    hash_s: float,
) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base_url, timeout=REQUEST_TIMEOUT_S) as client:
        await _wait_ready(client, proc, log)
        headers = await _login(client)
        # One hash alone sets the inline pace; a concurrent pair, the pace with both cores busy.
        alone_ms = await _hash(client, headers, CALIBRATION_ROUNDS, inline=False)
        pair = [_hash(client, headers, CALIBRATION_ROUNDS, inline=False) for _ in range(2)]
        paired_ms = max(await asyncio.gather(*pair))
        rounds_per_s = {
            "alone": CALIBRATION_ROUNDS / (alone_ms / 1000),
            "paired": CALIBRATION_ROUNDS / (paired_ms / 1000),
        }

        def rounds_for(seconds: float, pace: str) -> int:
            return max(1, min(MAX_ROUNDS, round(rounds_per_s[pace] * seconds)))

        pool_ms: list[float] = []
        inline_ms: list[float] = []

        async def keep_pool_busy() -> None:
            until = time.monotonic() + pool_s
            while time.monotonic() < until:
                rounds = rounds_for(hash_s, "paired")
                pair = [_hash(client, headers, rounds, inline=False) for _ in range(2)]
                pool_ms.extend(await asyncio.gather(*pair))

        async def hash_inline() -> None:
            await asyncio.sleep(INLINE_MARGIN_S)
            inline_ms.append(
                await _hash(client, headers, rounds_for(INLINE_HASH_S, "alone"), inline=True)
            )
            await asyncio.sleep(INLINE_MARGIN_S)

        phases: dict[str, Callable[[], Awaitable[None]]] = {
            "idle": lambda: asyncio.sleep(idle_s),
            "pool": keep_pool_busy,
            "inline": hash_inline,
        }
        pings = {name: await _pings_during(client, load()) for name, load in phases.items()}
    return {
        "pings_ms": pings,
        "pool_hash_ms": pool_ms,
        "inline_hash_ms": inline_ms,
        "rounds_per_s": rounds_per_s,
    }


def run(idle_s: float = 5.0, pool_s: float = 6.0, hash_s: float = 3.0) -> Result:
    """Start NATS, Redis and the web host, measure the three phases, stop everything."""
    with tempfile.TemporaryDirectory(prefix="mega-bench-") as tmp_name:
        tmp = Path(tmp_name)
        nats = EmbeddedNats(tmp / "nats")
        redis = EmbeddedRedis(tmp / "redis")
        proc: subprocess.Popen[bytes] | None = None
        try:
            nats.start()
            redis.start()
            port = free_port()
            log = tmp / "web.log"
            with log.open("wb") as out:
                command = [sys.executable, "-m", "mega", "start", "--port", str(port)]
                proc = subprocess.Popen(
                    [*command, "--config", str(CONFIG)],
                    cwd=ROOT,
                    env=_web_env(tmp, nats.url, redis.url),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own group: a Ctrl-C here reaches us, not it
                )
            base_url = f"http://127.0.0.1:{port}"
            data = asyncio.run(_measure(base_url, proc, log, idle_s, pool_s, hash_s))
        finally:
            if proc is not None:
                _stop_web(proc)
            redis.stop()
            nats.stop()

    stats = {name: summary(samples) for name, samples in data["pings_ms"].items()}
    idle, pool, inline = stats["idle"], stats["pool"], stats["inline"]
    pool_limit_ms = POOL_TARGET_FACTOR * idle["p99"]
    inline_hash_ms = max(data["inline_hash_ms"])
    pace = data["rounds_per_s"]
    rows = [row(f"idle: ping {stat}", idle[stat], show=ms) for stat in ("p50", "p99", "max")]
    for stat in ("p50", "p99", "max"):
        held = stat == "p99"
        rows.append(
            row(
                f"pool hashing: ping {stat}",
                pool[stat],
                show=ms,
                baseline=idle[stat],
                baseline_name="idle",
                target=f"<= {POOL_TARGET_FACTOR:g}x ({pool_limit_ms:.1f} ms)" if held else "",
                passed=pool[stat] <= pool_limit_ms if held else None,
            )
        )
    for stat in ("p50", "p99", "max"):
        held = stat == "max"
        rows.append(
            row(
                f"inline hashing: ping {stat}",
                inline[stat],
                show=ms,
                baseline=idle[stat],
                baseline_name="idle",
                # The contrast: a ping waited for most of the inline hash.
                target=f">= {inline_hash_ms / 2:.0f} ms (stall)" if held else "",
                passed=inline[stat] >= inline_hash_ms / 2 if held else None,
            )
        )
    pool_hash_ms = summary(data["pool_hash_ms"])["p50"]
    rows.append(row("pool hash duration, p50 of the runs", pool_hash_ms, show=ms))
    rows.append(row("inline hash duration", inline_hash_ms, show=ms))
    res = result(
        "heartbeat",
        "Heartbeat: /api/demo/ping while the CPU pool hashes",
        f"ping every {PING_INTERVAL_S * 1000:.0f} ms; idle {idle_s:g} s; pool: 2 concurrent "
        f"~{hash_s:g} s hashes for ~{pool_s:g} s; inline: one ~{INLINE_HASH_S:g} s hash; "
        f"samples idle/pool/inline: {idle['n']}/{pool['n']}/{inline['n']}",
        rows,
        notes=[
            f"pool target: p99 <= {POOL_TARGET_FACTOR:g} x idle p99, no floor; the benchmark "
            "client, the web host and both pool processes share the same cores (pool children "
            "run niced 10)",
            f"calibrated SHA-256 rounds/s: {pace['alone']:,.0f} alone, "
            f"{pace['paired']:,.0f} per hash of a concurrent pair",
        ],
        data={"stats": stats, **data},
    )
    print_table(res)
    return res


def _main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--idle-s", type=float, default=5.0, help="idle phase length")
    parser.add_argument("--pool-s", type=float, default=6.0, help="pool phase length (about)")
    parser.add_argument("--hash-s", type=float, default=3.0, help="length of one pool hash")
    options = parser.parse_args()
    res = run(idle_s=options.idle_s, pool_s=options.pool_s, hash_s=options.hash_s)
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(_main())
