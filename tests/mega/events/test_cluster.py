"""Events through the outbox on a real three-node NATS cluster (tests/cluster.py): the events
stream on three replicas keeps every relayed event while its leader node is SIGKILLed under
load, and every listener group still runs every event."""

from __future__ import annotations

from pathlib import Path

import pytest

from mega import EventBus
from mega.config import load_config
from mega.drivers.nats import NatsBus
from mega.drivers.nats.names import EVENTS_STREAM
from mega.runtime.bootstrap import boot, shutdown
from tests.cluster import NatsCluster
from tests.factories import write_config
from tests.mega.events.test_events_faults import (
    _count_is,
    classes,
    commit_events,
    config_body,
    groups_settled,
    runs,
    start_worker,
    stop,
    until,
)

EVENTS = 2_000
R3_BUS = """
services = {**services, "buses": {"jobs": {
    "driver": "nats", "url": services["buses"]["jobs"]["url"], "replicas": 3,
}}}
"""


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_relayed_events_survive_the_loss_of_the_events_stream_leader(
    cluster: NatsCluster,
    tmp_path: Path,
    redis_url: str,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAULT_PREFIX", prefix)
    body = R3_BUS + config_body()
    path = write_config(tmp_path, nats_url=cluster.url, redis_url=redis_url, body=body)
    config = load_config(path)
    ctx = await boot(config, role="test")
    redis, found = ctx.cache("main").native, classes(prefix)
    workers = [start_worker(config.path, prefix, tmp_path / f"w{n}.log") for n in (1, 2)]
    try:
        ids = await commit_events(ctx, found["event"], EVENTS)  # the relays publish them
        await until(lambda: _count_is(redis, prefix, "a", 500), "500 events in group a", 60)
        nats_bus = ctx.bus("jobs")
        assert isinstance(nats_bus, NatsBus)
        js = nats_bus.js
        info = await js.stream_info(EVENTS_STREAM)
        assert info.config.num_replicas == 3 and info.cluster is not None
        leader = info.cluster.leader
        assert leader is not None
        cluster.node(leader).kill()
        for group in ("a", "b", "c"):
            await until(
                lambda group=group: _count_is(redis, prefix, group, EVENTS), f"group {group}", 90
            )
        cluster.node(leader).start()
        await groups_settled(EventBus(ctx, "jobs"), found)  # nothing left to deliver again
        for group in ("a", "b", "c"):
            seen = await runs(redis, prefix, group)
            assert sorted(seen) == sorted(ids), group
            twice = [event_id for event_id, count in seen.items() if count > 1]
            # At most what was in flight at the failover: 10 per group in each process.
            assert len(twice) <= 2 * 10 * 2, (group, len(twice))
        assert all(worker.poll() is None for worker in workers), "a worker died"
    finally:
        for worker in workers:
            stop(worker)
        await shutdown(ctx)
    logs = "".join((tmp_path / f"w{n}.log").read_text() for n in (1, 2))
    assert "Traceback" not in logs, logs[-3000:]
