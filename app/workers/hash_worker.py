"""HashWorker: the `hash` CPU pool, two processes, running app/workers/hash_tasks.py."""

from __future__ import annotations

from mega import Worker


class HashWorker(Worker):
    name = "hash"  # ctx.workers["hash"]
    task_file = "app.workers.hash_tasks"  # dotted, or a path relative to the project root
    mode = "process"  # real parallelism: a thread would hold the GIL the web loop needs
    pool_size = 2
    # The page's "kill one child" spends one each (a timeout does not: that kill is on purpose);
    # once all are spent the demo refuses to kill (the next crash would break the shared pool).
    max_restarts = 10
