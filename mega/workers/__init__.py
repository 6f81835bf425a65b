"""CPU pools: `Worker` declares one, `WorkerPool` runs it, and a task reports how far it has got
with `progress(fraction, note)` (also `from mega import progress`)."""

from mega.workers.task_progress import progress

__all__ = ["progress"]
