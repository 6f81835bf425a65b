"""Faults that look like silence, on a real three-node NATS cluster in network namespaces
(tests/netns.py): a node's link set down for 10 s (its packets vanish: no RST, no FIN), or its
nats-server frozen for 10 s (SIGSTOP). Two `mega worker` processes, given the three URLs and
connected to the faulted node, run 5,000 TimedJobs (100 ms each, 20 in flight, on a stream with
three replicas) while an enqueuer connected to the same node adds ten jobs a second
(fault_run.py).

From the times the workers record (timeline.py), each scenario measures that every PubAck'd job
ran and no worker restarted; the longest time with work waiting and no job starting; the time
from the fault's start and from its end to the next job start; the longest time the enqueuer
stored nothing. The figures are printed, written to report.json and report.md in the test's
tmp_path, and held to TARGET_S.

    pytest tests/mega/jobs/test_silent_faults.py -s    # -s prints each scenario's figures
"""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.mega.jobs.fault_run import FAULT_S, FaultRun, Scenario
from tests.mega.jobs.timeline import longest_gap, longest_stall, next_start
from tests.netns import NetnsCluster

# The target for each timed figure: silence is noticed, and work resumes, within this.
TARGET_S = 10.0
TIMED = (
    "longest_stall_s",  # work waiting, no job starting
    "fault_to_next_start_s",
    "end_to_next_start_s",
    "enqueue_longest_without_puback_s",  # from the fault on
)
# A worker's log lines for its NATS connection, in the client's wordings before and after it
# learnt to leave a silent node.
DISCONNECT_LOGGED = r"^NATS .* (disconnected from|lost) "
RECONNECT_LOGGED = r"^NATS .* reconnected to "
# What the nodes' logs say of leaders and quorum, reported beside the figures.
SERVER_EVENTS = r"leader|quorum"
MAX_SERVER_EVENTS = 30
SCENARIOS = [
    Scenario("cut-leader", "cut", "leader"),
    Scenario("cut-follower", "cut", "follower"),
    Scenario("freeze-follower", "freeze", "follower"),
]


def seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def figures(run: FaultRun) -> dict[str, Any]:
    """What the run measured, in seconds; `*_after_fault_s` from the fault's start."""
    records, attempts, since = run.records.read(), run.enqueuer.attempts, run.fault_at
    pubacked = run.pubacked()
    times = records.start_times()
    started, done = records.started(), set(records.done)
    stall = longest_stall(pubacked, records.starts, run.observed_until)
    lost = sorted(set(pubacked) - done)
    sent = {a.job_id for a in attempts} | set(run.backlog)
    later_acks = [a.acked for a in attempts if a.acked is not None]
    last_sent = max((a.sent for a in attempts), default=since)
    errors = Counter(a.error for a in attempts if a.error is not None)
    runs = Counter(job_id for _, job_id in records.starts)
    return {
        "scenario": run.scenario.name,
        "fault": f"{run.scenario.fault} {run.target} for {FAULT_S:g} s",
        "fault_began_at": datetime.fromtimestamp(run.fault_at, UTC).isoformat(),
        "fault_ended_at": datetime.fromtimestamp(run.ended_at, UTC).isoformat(),
        "leaders": run.leaders,
        "longest_stall_s": seconds(stall.seconds),
        "longest_stall_after_fault_s": [seconds(stall.since - since), seconds(stall.until - since)],
        # after the fault's end alone: the stall a cut's own can hide (acks lost in the fault)
        "longest_stall_after_end_s": seconds(
            longest_stall(pubacked, records.starts, run.observed_until, since=run.ended_at).seconds
        ),
        # a start in the fault's first instants may be a delivery that was already on its way
        "fault_to_next_start_s": seconds(next_start(times, since)),
        "end_to_next_start_s": seconds(next_start(times, run.ended_at)),
        "enqueue_longest_without_puback_s": seconds(longest_gap(later_acks, since, last_sent)),
        "starts_during_fault": sum(since <= at < run.ended_at for at in times),
        "jobs": {
            "pubacked": len(pubacked),
            "started": len(started),
            "done": len(done),
            "lost": len(lost),
            "lost_ids": lost[:10],
            "ran_without_puback": len(started - set(pubacked)),  # a publish that timed out
            "never_enqueued": sorted(started - sent)[:10],
            "started_again": sum(n > 1 for n in runs.values()),
        },
        "enqueues": {
            "sent": len(attempts),
            "pubacked": len(later_acks),
            "failed": sum(errors.values()),
            "no_answer": sum(a.acked is None and a.error is None for a in attempts),
            "errors": errors.most_common(3),
        },
        "workers": [worker_figures(run, worker.pid, worker.output()) for worker in run.workers],
        "server_events": server_events(run),
    }


def worker_figures(run: FaultRun, pid: int, output: str) -> dict[str, Any]:
    def after_fault(pattern: str) -> list[float | None]:
        times = [at - run.fault_at for at in logged_times(output, pattern) if at >= run.fault_at]
        return [seconds(at) for at in times[:3]]

    return {
        "pid": pid,
        "alive": run.alive_at_end.get(pid, False),
        "traceback": "Traceback" in output,
        "connected_to": {
            "before": run.connected_to.get(pid),
            "after": run.connected_at_end.get(pid),
        },
        "disconnect_logged_after_fault_s": after_fault(DISCONNECT_LOGGED),
        "reconnect_logged_after_fault_s": after_fault(RECONNECT_LOGGED),
    }


def logged_times(output: str, pattern: str) -> list[float]:
    """When a host logged a message that `pattern` finds (its JSON logs), in epoch s."""
    times = []
    for line in output.splitlines():
        if line.startswith("{") and re.search(pattern, (entry := json.loads(line))["message"]):
            times.append(datetime.fromisoformat(entry["ts"]).timestamp())
    return times


def server_events(run: FaultRun) -> list[str]:
    """The nodes' elections and lost quorums from the fault's start on: `+<s> <node>: <line>`."""
    events = []
    for node in run.cluster.nodes:
        for line in node.log_path.read_text(errors="replace").splitlines():
            found = re.match(r"\[\d+\] (\S+ \S+) \[\w+\] (.*)", line)
            if found and re.search(SERVER_EVENTS, found[2]):
                at = datetime.strptime(found[1], "%Y/%m/%d %H:%M:%S.%f").timestamp()  # local
                if run.fault_at <= at <= run.observed_until:
                    events.append((at, f"{at - run.fault_at:+.2f} {node.server_name}: {found[2]}"))
    return [text for _, text in sorted(events)][:MAX_SERVER_EVENTS]


def problems(figures: dict[str, Any]) -> list[str]:
    """What the figures fall short in: a job lost, a worker down, a time at or past TARGET_S."""
    found = []
    jobs = figures["jobs"]
    if jobs["lost"]:
        found.append(f"{jobs['lost']} PubAck'd jobs never done (e.g. {jobs['lost_ids']})")
    if jobs["never_enqueued"]:
        found.append(f"jobs ran that were never enqueued: {jobs['never_enqueued']}")
    for worker in figures["workers"]:
        if not worker["alive"] or worker["traceback"]:
            found.append(
                f"worker {worker['pid']}: alive {worker['alive']}, traceback {worker['traceback']}"
            )
        if not worker["disconnect_logged_after_fault_s"]:
            found.append(f"worker {worker['pid']} never said it lost the faulted node")
    for name in TIMED:
        if figures[name] is None or figures[name] >= TARGET_S:
            found.append(f"{name} = {figures[name]} (target < {TARGET_S:g} s)")
    return found


def write_report(folder: Path, figures: dict[str, Any], found: list[str]) -> str:
    """report.json and report.md in `folder`; returns the markdown."""
    (folder / "report.json").write_text(json.dumps({**figures, "problems": found}, indent=2))
    text = "\n".join([
        f"## {figures['scenario']}: {figures['fault']} (leaders: {figures['leaders']})", "",
        "| figure | seconds | target |", "| --- | --- | --- |",
        *[f"| {name} | {figures[name]} | < {TARGET_S:g} |" for name in TIMED], "",
        f"fault from {figures['fault_began_at']} to {figures['fault_ended_at']}",
        f"longest stall, from and to (s after the fault's start): "
        f"{figures['longest_stall_after_fault_s']}",
        f"longest stall after the fault's end: {figures['longest_stall_after_end_s']} s",
        f"starts during the fault: {figures['starts_during_fault']}",
        f"jobs: {figures['jobs']}", f"enqueues: {figures['enqueues']}",
        *[f"worker: {worker}" for worker in figures["workers"]],
        "", "server events (s after the fault's start):",
        *[f"    {event}" for event in figures["server_events"]], "",
        *[f"problem: {problem}" for problem in found], "",
    ])  # fmt: skip
    (folder / "report.md").write_text(text)
    return text


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda scenario: scenario.name)
async def test_a_silent_node_is_left_and_work_resumes_within_the_target(
    scenario: Scenario, netns_cluster: NetnsCluster, tmp_path: Path, prefix: str
) -> None:
    run = FaultRun(netns_cluster, scenario, tmp_path, prefix)
    try:
        await run.run()
    finally:
        await run.stop()
    measured = figures(run)
    found = problems(measured)
    print("\n" + write_report(tmp_path, measured, found))
    assert not found, "\n".join([*found, json.dumps(measured, indent=2)])
