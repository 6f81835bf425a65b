"""JobRunner: the job-consumer host's runtime, one consume loop per registered Job.

Not to be confused with `Worker` (a CPU pool): a JobRunner runs the jobs of its buses, on any
driver. Its signals: dispatch, start, progress (when a job reports it), done, retry, fail (with
`phase`), dlq. The loop is mega/lanes/consumer.py; the host side is `LaneRunner` (lanes.py).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from mega.jobs.queue import SIGNALS, JobQueue
from mega.jobs.spec import JobSpec, validate_job
from mega.lanes.endpoint import LaneRunner


class JobRunner(LaneRunner[JobQueue, JobSpec]):
    """Consume every registered Job class of this process (see LaneRunner)."""

    endpoint_cls = JobQueue
    signal_names: ClassVar[tuple[str, ...]] = SIGNALS
    kind: ClassVar[str] = "job"
    logger: ClassVar[logging.Logger] = logging.getLogger("mega.jobrunner")

    def validate(self, cls: type[Any]) -> JobSpec:
        return validate_job(cls, self.ctx.buses)

    def key(self, spec: JobSpec) -> object:
        """What makes two registrations the same one: the Job class.

        Args:
            spec: a registered job's validated spec.
        """
        return spec.job_cls

    def queue(self, bus_alias: str) -> JobQueue:
        """The queue of a bus alias (made on first use), sharing this worker's observers.

        Args:
            bus_alias: a bus alias of the config (ConfigError naming it otherwise).
        """
        return self.endpoint(bus_alias)
