"""One silent-fault run on a NetnsCluster (tests/netns.py), for test_silent_faults.py: a backlog
of JOBS TimedJobs, an enqueuer and two `mega worker` processes connected to the node to be
faulted, the fault for FAULT_S, then until every PubAck'd job is done. What happened stays on
the run (the workers' records, the enqueuer's attempts, the instants) to be measured.

    run = FaultRun(cluster, Scenario("cut-follower", "cut", "follower"), tmp_path, prefix)
    try:
        await run.run()
    finally:
        await run.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mega import JobQueue
from mega.config import load_config
from mega.drivers.nats import NatsBus
from mega.drivers.nats.names import JOB_CONSUMER, stream_name
from mega.jobs.job import Job
from mega.runtime.bootstrap import boot, shutdown
from tests.factories import write_config
from tests.mega.jobs import fault_jobs
from tests.mega.jobs.test_jobs_faults import MegaWorker, for_prefix, registration
from tests.mega.jobs.timeline import Records
from tests.netns import CLIENT_PORT, NetnsCluster
from tests.processes import tcp_peers

JOBS = 5_000  # 100 ms each, 20 at a time: 25 s of work, through the fault
BATCH = 1_000  # jobs per enqueue_many
FAULT_S = 10.0
WARMUP_STARTS = 400  # jobs started before the fault: both workers are in full swing
ENQUEUE_EVERY_S = 0.1
# After the fault, the enqueuer goes on until a PubAck comes, for this long at most.
ENQUEUE_AFTER_MAX_S = 15.0
PUBLISH_WAIT_S = 10.0  # what it then waits for the answers still due, at most
# After the fault, every PubAck'd job is done within this, or the run is measured as it is.
SETTLE_S = 90.0
READY_S = 30.0  # connected, consuming, warmed up
STOP_S = 15.0
POLL_S = 0.2


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: Literal["cut", "freeze"]
    # The faulted node, where the clients connect: the one that leads the stream and its
    # consumer, or one that leads neither.
    target: Literal["leader", "follower"]


@dataclass
class Attempt:
    """One enqueue of the enqueuer: when it was sent, when its PubAck came, or its error."""

    job_id: str
    sent: float
    acked: float | None = None
    error: str | None = None


@dataclass
class Enqueuer:
    """Enqueues a job every ENQUEUE_EVERY_S until `stopping` is set, each publish on its own
    (one waiting for its PubAck does not hold up the next); `run()` on a thread of the hub."""

    config: Path
    job: type[Job]
    connected: threading.Event = field(default_factory=threading.Event)
    stopping: threading.Event = field(default_factory=threading.Event)
    attempts: list[Attempt] = field(default_factory=list)

    async def run(self) -> None:
        ctx = await boot(load_config(self.config), role="enqueuer", database=False)
        queue = JobQueue(ctx, "jobs")
        pending: set[asyncio.Task[None]] = set()
        try:
            await queue.ensure(self.job)
            self.connected.set()
            begun = time.monotonic()
            while not self.stopping.is_set():
                attempt = Attempt(f"e{len(self.attempts):05d}", time.time())
                self.attempts.append(attempt)
                pending.add(asyncio.create_task(self.enqueue(queue, attempt)))
                next_at = begun + len(self.attempts) * ENQUEUE_EVERY_S
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if pending:
                await asyncio.wait(pending, timeout=PUBLISH_WAIT_S)
        finally:
            for task in pending:
                task.cancel()  # no answer by now: neither acked nor failed
            await shutdown(ctx)

    async def enqueue(self, queue: JobQueue, attempt: Attempt) -> None:
        try:
            await queue.enqueue(self.job, {"id": attempt.job_id}, id=attempt.job_id)
            attempt.acked = time.time()
        except Exception as exc:
            attempt.error = f"{type(exc).__name__}: {exc}"

    def acked_since(self, instant: float) -> bool:
        return any(a.acked is not None and a.acked >= instant for a in self.attempts)


async def enqueue_backlog(config: Path, job: type[Job]) -> dict[str, float]:
    """The job's queue with JOBS jobs in it, its consumer led by the node that leads the stream
    (one node leads both); returns when each job was PubAck'd (epoch s)."""
    ctx = await boot(load_config(config), role="test", database=False)
    try:
        queue = JobQueue(ctx, "jobs")
        spec = await queue.ensure(job)
        acked: dict[str, float] = {}
        ids = [f"b{n:05d}" for n in range(JOBS)]
        for start in range(0, JOBS, BATCH):
            batch = ids[start : start + BATCH]
            await queue.enqueue_many(job, [{"id": job_id} for job_id in batch])
            acked.update(dict.fromkeys(batch, time.time()))
        bus = queue.bus
        assert isinstance(bus, NatsBus)
        stream = stream_name(spec.subject)
        info = await bus.js.stream_info(stream)
        assert info.cluster is not None and info.cluster.leader is not None
        await lead_consumer(bus, stream, info.cluster.leader)
        return acked
    finally:
        await shutdown(ctx)


async def lead_consumer(bus: NatsBus, stream: str, node: str) -> None:
    """Move the job consumer's leadership to `node`: a stepdown naming it as the preferred
    placement (nats-server 2.11+), again until the consumer says so."""
    subject = f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{JOB_CONSUMER}"
    request = json.dumps({"placement": {"preferred": node}}).encode()
    deadline = time.monotonic() + READY_S
    while True:
        info = await bus.js.consumer_info(stream, JOB_CONSUMER)
        if info.cluster is not None and info.cluster.leader == node:
            return
        assert time.monotonic() < deadline, f"the consumer's leader did not move to {node}"
        await bus.native.request(subject, request, timeout=5)
        await asyncio.sleep(POLL_S)


def faulted_node(target: str, leaders: dict[str, str], names: list[str]) -> str:
    """The stream's leader, or a node that leads neither the stream nor its consumer (not
    JetStream's meta group either, when there is the choice)."""
    if target == "leader":
        return leaders["stream"]
    followers = [name for name in names if name not in (leaders["stream"], leaders["consumer"])]
    return sorted(followers, key=lambda name: name == leaders["meta"])[0]


async def wait_for(check: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `check` until it holds (True) or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


class FaultRun:
    """One scenario, from the backlog to every PubAck'd job done; `stop()` ends what `run()`
    started, the fault first."""

    def __init__(
        self, cluster: NetnsCluster, scenario: Scenario, tmp_path: Path, prefix: str
    ) -> None:
        self.cluster, self.scenario, self.tmp_path, self.prefix = (
            cluster,
            scenario,
            tmp_path,
            prefix,
        )
        self.config = write_config(
            tmp_path, nats_url=cluster.url, redis_url=None, body=registration("TimedJob")
        )
        self.job = for_prefix(fault_jobs.TimedJob, prefix)
        self.records = Records(tmp_path / "records")
        self.enqueuer = Enqueuer(self.config, self.job)
        self.enqueuing: asyncio.Future[None] | None = None
        self.workers: list[MegaWorker] = []
        self.faulted = False
        self.target = ""
        self.leaders: dict[str, str] = {}
        self.backlog: dict[str, float] = {}  # job id -> PubAck time
        self.connected_to: dict[int, list[str]] = {}  # worker pid -> nodes, before the fault
        self.connected_at_end: dict[int, list[str]] = {}
        self.alive_at_end: dict[int, bool] = {}
        self.fault_at = self.ended_at = self.observed_until = 0.0

    async def run(self) -> None:
        cluster = self.cluster
        self.records.folder.mkdir()
        self.backlog = await cluster.hub.run(enqueue_backlog(self.config, self.job))
        self.leaders = cluster.leaders(stream_name(self.job.subject), JOB_CONSUMER)
        names = [node.server_name for node in cluster.nodes]
        self.target = faulted_node(self.scenario.target, self.leaders, names)
        with cluster.reach_only(self.target):  # so every client connects to the target
            await self.start_clients()
        self.connected_to = {worker.pid: self.servers_of(worker.pid) for worker in self.workers}
        assert all(nodes == [self.target] for nodes in self.connected_to.values()), (
            f"the workers are not on {self.target} alone: {self.connected_to}"
        )
        warm = await wait_for(lambda: len(self.records.read().starts) >= WARMUP_STARTS, READY_S)
        assert warm, f"{WARMUP_STARTS} jobs did not start in {READY_S:g} s"

        self.fault_at = time.time()
        self.fault(True)
        await asyncio.sleep(FAULT_S)  # the fault's length: what is tested, not a wait for it
        self.fault(False)
        self.ended_at = time.time()
        await wait_for(lambda: self.enqueuer.acked_since(self.ended_at), ENQUEUE_AFTER_MAX_S)
        self.enqueuer.stopping.set()
        assert self.enqueuing is not None
        await self.enqueuing
        await self.settle()

    def fault(self, on: bool) -> None:
        start, end = self.cluster.cut, self.cluster.heal
        if self.scenario.fault == "freeze":
            start, end = self.cluster.freeze, self.cluster.thaw
        (start if on else end)(self.target)
        self.faulted = on

    async def start_clients(self) -> None:
        """The enqueuer, connected, then two workers, consuming."""
        enqueuing = asyncio.ensure_future(self.cluster.hub.run(self.enqueuer.run()))
        self.enqueuing = enqueuing

        def connected() -> bool:
            if enqueuing.done():
                enqueuing.result()  # its error, when it could not start
            return self.enqueuer.connected.is_set()

        assert await wait_for(connected, READY_S), "the enqueuer did not connect"
        env = {"FAULT_RECORDS": str(self.records.folder), "MEGA_LOG_FORMAT": "json"}
        for n in (1, 2):
            log = self.tmp_path / f"worker{n}.log"
            launch = self.cluster.hub.command
            self.workers.append(MegaWorker(self.config, self.prefix, log, launch=launch, env=env))
        for worker in self.workers:
            await worker.ready()

    async def settle(self) -> None:
        """Until every PubAck'd job is done, or SETTLE_S: then the run is measured as it is."""
        wanted = set(self.pubacked())
        await wait_for(lambda: wanted <= set(self.records.read().done), SETTLE_S)
        self.observed_until = time.time()
        for worker in self.workers:
            self.connected_at_end[worker.pid] = self.servers_of(worker.pid)
            self.alive_at_end[worker.pid] = worker.proc.poll() is None

    async def stop(self) -> None:
        if self.faulted:
            self.fault(False)
        self.enqueuer.stopping.set()
        for worker in self.workers:
            worker.proc.terminate()
        for worker in self.workers:
            with contextlib.suppress(AssertionError):  # still draining: killed below
                await worker.exit_code(STOP_S)
            worker.kill()
        if self.enqueuing is not None:  # last: it raises what made the enqueuer fail
            await asyncio.wait_for(self.enqueuing, PUBLISH_WAIT_S + 5)

    def pubacked(self) -> dict[str, float]:
        """Every job the cluster PubAck'd: the backlog's and the enqueuer's, with the time."""
        later = {a.job_id: a.acked for a in self.enqueuer.attempts if a.acked is not None}
        return {**self.backlog, **later}

    def servers_of(self, pid: int) -> list[str]:
        """The nodes process `pid` holds client connections to."""
        peers = {address for address, port in tcp_peers(pid) if port == CLIENT_PORT}
        return sorted(self.cluster.server_of(address) or address for address in peers)
