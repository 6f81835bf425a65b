"""Tasks of the `hash` CPU pool. Each top-level public function is a task, called as fn(args).

This module runs inside the pool's child processes: keep its imports light (no web framework;
`mega` loads only what is used, here `progress`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from mega import progress

DEFAULT_ROUNDS = 1_000_000
# About 3 million rounds a second on an idle laptop core (the worker page measures the machine it
# runs on): the cap keeps one run under ~15 s there.
MAX_ROUNDS = 50_000_000
# Rounds between two progress() calls: ~30 ms of hashing here, so the bar moves smoothly while
# the call itself (its throttle sends at most one message per 50 ms) costs nothing measurable.
PROGRESS_EVERY_ROUNDS = 100_000


def sha256_loop(task: dict[str, Any]) -> dict[str, Any]:
    """Hash `input` with SHA-256, then hash the hex digest again, `rounds` times in all.

    `task` is `{"input": str, "rounds": int}` (rounds defaults to 1,000,000; 1..MAX_ROUNDS).
    Returns `{"digest": hex str, "rounds": int}`. In a pool it reports the rounds done with
    `progress()` (run it with `on_progress=` to see them); called directly, that is a no-op.
    """
    rounds = task.get("rounds", DEFAULT_ROUNDS)
    if not isinstance(rounds, int) or isinstance(rounds, bool) or not 1 <= rounds <= MAX_ROUNDS:
        raise ValueError(f"rounds must be an int from 1 to {MAX_ROUNDS}, got {rounds!r}")
    text = task.get("input", "")
    if not isinstance(text, str):
        raise ValueError("input must be a string")
    digest = text.encode()
    sha256 = hashlib.sha256
    done = 0
    while done < rounds:
        step = min(PROGRESS_EVERY_ROUNDS, rounds - done)
        for _ in range(step):
            digest = sha256(digest).hexdigest().encode()
        done += step
        progress(done / rounds, f"{done:,} of {rounds:,} rounds")
    return {"digest": digest.decode(), "rounds": rounds}
