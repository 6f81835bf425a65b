"""The task module of bench_worker_pool: `noop` is its only public function.

Both the WorkerPool children (which import this module by name) and ProcessPoolExecutor (which
pickles `noop` by reference) run it, so it lives apart from the benchmark and imports nothing.
"""

from __future__ import annotations


def noop(args: int) -> int:
    """The trivial task: returns its argument."""
    return args
