"""What a fault run's records say: when the jobs started and were done, as the workers wrote
them (fault_jobs.TimedJob: `<epoch s> start|done <job id>`, a file per process), and the
figures the silent-fault tests hold to a target, as pure functions of those times.

    records = Records(folder).read()      # again to read what was added since
    longest_stall(acked, records.starts, until)   # work waiting, no job starting
    next_start(records.start_times(), after)      # from an instant to the next start
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Records:
    """Every line of the record files in `folder`, read incrementally (a line is written whole
    by one append, so only a last line without its newline is left for the next read)."""

    folder: Path
    starts: list[tuple[float, str]] = field(init=False, default_factory=list)
    done: dict[str, int] = field(init=False, default_factory=dict)  # job id -> runs completed
    _offsets: dict[Path, int] = field(init=False, default_factory=dict)

    def read(self) -> Records:
        for path in sorted(self.folder.glob("*.log")):
            with path.open("rb") as file:
                file.seek(self._offsets.get(path, 0))
                chunk = file.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self._offsets[path] = self._offsets.get(path, 0) + len(complete)
            for line in complete.decode().splitlines():
                at, event, job_id = line.split(" ", 2)
                if event == "start":
                    self.starts.append((float(at), job_id))
                else:
                    self.done[job_id] = self.done.get(job_id, 0) + 1
        return self

    def started(self) -> set[str]:
        return {job_id for _, job_id in self.starts}

    def start_times(self) -> list[float]:
        return sorted(at for at, _ in self.starts)


@dataclass(frozen=True)
class Stall:
    """A time with work waiting and no job starting: `seconds` long, from `since` to `until`
    (epoch s)."""

    seconds: float
    since: float
    until: float


def longest_stall(
    acked: Mapping[str, float],
    starts: Sequence[tuple[float, str]],
    until: float,
    since: float | None = None,
) -> Stall:
    """The longest time from `since` (default: the first start, or with none the first PubAck)
    to `until` in which some job was waiting (its PubAck came, `acked[id]`, and it had not
    started yet) and no job started. A job never started waits until `until`; a job missing
    from `acked` waits for nothing."""
    times = sorted(at for at, _ in starts)
    first = times[0] if times else min(acked.values(), default=until)
    begin = first if since is None else since
    first_start: dict[str, float] = {}
    for at, job_id in sorted(starts):
        first_start.setdefault(job_id, at)
    # The jobs by first start (never: infinity); waiting[k] is the earliest PubAck among the
    # jobs from k on: all of them still wait just before the k-th first start.
    order = sorted(acked, key=lambda job_id: first_start.get(job_id, math.inf))
    begins = [first_start.get(job_id, math.inf) for job_id in order]
    waiting = [math.inf] * (len(order) + 1)
    for k in range(len(order) - 1, -1, -1):
        waiting[k] = min(acked[order[k]], waiting[k + 1])
    edges = [begin, *[at for at in times if begin < at < until], until]
    longest = Stall(0.0, begin, begin)
    for before, after in itertools.pairwise(edges):
        start = max(before, waiting[bisect.bisect_left(begins, after)])
        if after - start > longest.seconds:
            longest = Stall(after - start, start, after)
    return longest


def next_start(times: Sequence[float], after: float) -> float | None:
    """Seconds from `after` to the first of the sorted start `times` past it; None if none."""
    k = bisect.bisect_right(times, after)
    return times[k] - after if k < len(times) else None


def longest_gap(times: Sequence[float], since: float, until: float) -> float:
    """The longest time between `since` and `until` with none of `times` in it (the enqueuer's
    PubAcks: how long it stored nothing)."""
    inside = sorted(at for at in times if since <= at <= until)
    edges = [since, *inside, until]
    return max(b - a for a, b in itertools.pairwise(edges))
