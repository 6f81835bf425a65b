"""The peers the benchmarks compare with, each driven by a small script of this folder that runs
in the peers' own virtualenv (.venv-peers, `make bench` makes it), never in mega's: it prints
one JSON line (its rate, how many jobs ran, whether each ran exactly once) and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

PEERS_DIR = Path(__file__).resolve().parent
PEERS_PYTHON = PEERS_DIR.parents[1] / ".venv-peers" / "bin" / "python"


async def run_peer(script: str, *args: str, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run `bench/peers/<script>` with the peers' Python and return the JSON of its last line;
    the child is killed if it outlives `timeout_s` or we are cancelled."""
    if not PEERS_PYTHON.exists():
        raise RuntimeError(f"no {PEERS_PYTHON}: `make .venv-peers/.installed` (or `make bench`)")
    proc = await asyncio.create_subprocess_exec(
        str(PEERS_PYTHON), str(PEERS_DIR / script), *args, stdout=asyncio.subprocess.PIPE
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"the peer {script} failed (exit {proc.returncode})")
    lines = out.decode().strip().splitlines()
    if not lines:
        raise RuntimeError(f"the peer {script} printed nothing")
    answer: dict[str, Any] = json.loads(lines[-1])
    return answer
