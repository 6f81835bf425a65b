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
tmp_path, and held to TARGET_S, or where the faulted node led the stream or its consumer, to
the engine's own election of a new leader plus CLIENT_S (what the clients may add to it).

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

from mega.drivers.nats.names import JOB_CONSUMER, stream_name
from mega.drivers.nats.receiver import IDLE_WAIT_S, PULL_SILENT_S
from tests.mega.jobs.fault_run import FAULT_S, FaultRun, Scenario
from tests.mega.jobs.timeline import longest_gap, longest_stall, next_start
from tests.netns import NetnsCluster

# The target for each timed figure: silence is noticed, and work resumes, within this...
TARGET_S = 5.0
# ... or, when the faulted node led the job stream or its consumer, within this of the new
# leader's election. JetStream elects a lost leader's successor only after a random 4 to 9 s
# (nats-server's raft election timeout, which it does not let a deployment set): until then no
# client can publish or pull from any node, and what is measured is what the clients add. A
# worker pulls again when the election is announced (0.01 to 0.75 s after it, measured), or,
# when the announcement did not reach it, once its pull has been silent for PULL_SILENT_S.
CLIENT_S = PULL_SILENT_S + IDLE_WAIT_S
# The test fails a figure at twice its target, and report.md marks each one past the target
# itself. The figures are the workers' reaction times, and on a machine busy with the rest of
# the suite their timers fire late: once, in a loaded CI run, the stall after a healed
# follower made the consumer's leader step down was 9.5 s against a target of 7.3 s (5.2 s
# from the election to the next start, not 3). Twice the target still fails a worker that
# does not notice silence (stalls of 13.8 to 16.7 s before the workers learnt to), and the
# check that each worker logged the lost node fails it outright.
HELD_FACTOR = 2.0
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
    Scenario("freeze-leader", "freeze", "leader"),
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
    later_acks = sorted(a.acked for a in attempts if a.acked is not None)
    first = elections(run)
    last_sent = max((a.sent for a in attempts), default=since)
    errors = Counter(a.error for a in attempts if a.error is not None)
    runs = Counter(job_id for _, job_id in records.starts)
    return {
        "scenario": run.scenario.name,
        "fault": f"{run.scenario.fault} {run.target} for {FAULT_S:g} s",
        "fault_began_at": datetime.fromtimestamp(run.fault_at, UTC).isoformat(),
        "fault_ended_at": datetime.fromtimestamp(run.ended_at, UTC).isoformat(),
        "fault_s": seconds(run.ended_at - run.fault_at),
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
        # the engine's elections in the fault, and from each to the clients' next step
        "consumer_elected_after_fault_s": seconds(first["consumer"]),
        "stream_elected_after_fault_s": seconds(first["stream"]),
        "consumer_elected_to_next_start_s": after_election(times, since, first["consumer"]),
        "stream_elected_to_next_puback_s": after_election(later_acks, since, first["stream"]),
        # every new consumer leader, whoever led: a heal too can make its leader step down
        "consumer_elections_after_fault_s": [seconds(at) for at in elected(run, "consumer")],
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


def logged_by_nodes(run: FaultRun, pattern: str) -> list[tuple[float, str, str]]:
    """The nodes' log lines that `pattern` finds, from the fault's start to the end of the
    run: (epoch s, node, line), in time order."""
    events = []
    for node in run.cluster.nodes:
        for line in node.log_path.read_text(errors="replace").splitlines():
            found = re.match(r"\[\d+\] (\S+ \S+) \[\w+\] (.*)", line)
            if found and re.search(pattern, found[2]):
                at = datetime.strptime(found[1], "%Y/%m/%d %H:%M:%S.%f").timestamp()  # local
                if run.fault_at <= at <= run.observed_until:
                    events.append((at, node.server_name, found[2]))
    return sorted(events)


def server_events(run: FaultRun) -> list[str]:
    """The nodes' elections and lost quorums from the fault's start on: `+<s> <node>: <line>`."""
    events = logged_by_nodes(run, SERVER_EVENTS)[:MAX_SERVER_EVENTS]
    return [f"{at - run.fault_at:+.2f} {node}: {line}" for at, node, line in events]


def elected(run: FaultRun, name: str) -> list[float]:
    """When, in s after the fault's start, the job stream (`name` "stream") or its consumer
    ("consumer") got a new leader, in time order, whoever led it before."""
    stream = stream_name(run.job.subject)
    words = {
        "stream": f"new stream leader for '$G > {stream}'",
        "consumer": f"new consumer leader for '$G > {stream} > {JOB_CONSUMER}'",
    }[name]
    return [at - run.fault_at for at, _, _ in logged_by_nodes(run, re.escape(words))]


def elections(run: FaultRun) -> dict[str, float | None]:
    """When, in s after the fault's start, the job stream and its consumer first got a new
    leader, for those the faulted node led (None: it led neither). The election may come after
    the fault's end: under a busy suite, the two nodes left once elected no consumer leader for
    the whole 10 s cut, and the next came 4.9 s after the heal."""
    found: dict[str, float | None] = {}
    for name in ("stream", "consumer"):
        times = elected(run, name)
        found[name] = times[0] if run.leaders[name] == run.target and times else None
    return found


def after_election(times: list[float], since: float, elected: float | None) -> float | None:
    """From an election `elected` s after `since` to the next of `times` (sorted, epoch s)."""
    return None if elected is None else seconds(next_start(times, since + elected))


def last_election_within(
    elections: list[float], start: float, length: float | None
) -> float | None:
    """The last of `elections` from `start` to `start + length` (s after the fault's start):
    the consumer leader a span of no job starting could not end without."""
    within = [at for at in elections if length is not None and start <= at <= start + length]
    return within[-1] if within else None


def limits(figures: dict[str, Any]) -> dict[str, float]:
    """Each timed figure's limit: TARGET_S, or CLIENT_S after the election it had to wait
    for, counted from where the figure starts. The starts wait for the last new consumer
    leader within their span, whoever led before (a healed node can make the leader step down,
    and the next one came 8 s later under a busy suite); the PubAcks for the stream's new
    leader where the faulted node led it."""
    stall_since = figures["longest_stall_after_fault_s"][0]
    spans = {  # each figure's span of waiting: its start (s after the fault's) and length
        "longest_stall_s": (stall_since, figures["longest_stall_s"]),  # no job starting
        "fault_to_next_start_s": (0.0, figures["fault_to_next_start_s"]),
        "end_to_next_start_s": (figures["fault_s"], figures["end_to_next_start_s"]),
    }
    waited = {
        name: (last_election_within(figures["consumer_elections_after_fault_s"], *span), span[0])
        for name, span in spans.items()
    }
    waited["enqueue_longest_without_puback_s"] = (figures["stream_elected_after_fault_s"], 0.0)
    return {
        name: TARGET_S if election is None else max(TARGET_S, election - since + CLIENT_S)
        for name, (election, since) in waited.items()
    }


def problems(figures: dict[str, Any], factor: float = HELD_FACTOR) -> list[str]:
    """What the figures fall short in: a job lost, a worker down, a time at or past `factor`
    times its limit (see `limits`)."""
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
    for name, limit in limits(figures).items():
        if figures[name] is None or figures[name] >= factor * limit:
            found.append(f"{name} = {figures[name]} (held to < {factor * limit:.2f} s)")
    return found


def verdict(value: float | None, limit: float) -> str:
    """A figure against its target, in report.md."""
    if value is not None and value < limit:
        return "met"
    return "missed" if value is not None and value < HELD_FACTOR * limit else "failed"


def write_report(folder: Path, figures: dict[str, Any], found: list[str]) -> str:
    """report.json and report.md in `folder`; returns the markdown."""
    (folder / "report.json").write_text(json.dumps({**figures, "problems": found}, indent=2))
    held = limits(figures)
    text = "\n".join(
        [
            f"## {figures['scenario']}: {figures['fault']} (leaders: {figures['leaders']})",
            "",
            "| figure | seconds | target | |",
            "| --- | --- | --- | --- |",
            *[
                f"| {name} | {figures[name]} | < {limit:.2f} | {verdict(figures[name], limit)} |"
                for name, limit in held.items()
            ],
            "",
            f"new leaders where the faulted node led (s after the fault's start): consumer "
            f"{figures['consumer_elected_after_fault_s']}, "
            f"stream {figures['stream_elected_after_fault_s']}",
            f"new consumer leaders, whoever led: {figures['consumer_elections_after_fault_s']}",
            f"from the election to the clients' next step (s): start "
            f"{figures['consumer_elected_to_next_start_s']}, PubAck "
            f"{figures['stream_elected_to_next_puback_s']}",
            f"fault from {figures['fault_began_at']} to {figures['fault_ended_at']}",
            f"longest stall, from and to (s after the fault's start): "
            f"{figures['longest_stall_after_fault_s']}",
            f"longest stall after the fault's end: {figures['longest_stall_after_end_s']} s",
            f"starts during the fault: {figures['starts_during_fault']}",
            f"jobs: {figures['jobs']}",
            f"enqueues: {figures['enqueues']}",
            *[f"worker: {worker}" for worker in figures["workers"]],
            "",
            "server events (s after the fault's start):",
            *[f"    {event}" for event in figures["server_events"]],
            "",
            *[f"problem: {problem}" for problem in found],
            "",
        ]
    )
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


def test_a_span_that_waited_for_an_election_is_judged_from_it() -> None:
    """The limits, on the figures of a run where the heal made the consumer's leader step down
    and its successor came 8 s later: the stall it caused is the engine's, the 0.04 s after it
    the clients'. A stall with no election in it, or one too long after it, is a problem."""
    measured = {
        "fault_s": 10.0,
        "longest_stall_s": 8.08,
        "longest_stall_after_fault_s": [10.26, 18.34],
        "fault_to_next_start_s": 0.0,
        "end_to_next_start_s": 0.0,
        "consumer_elections_after_fault_s": [18.3],
        "stream_elected_after_fault_s": None,
    }
    held = limits(measured)
    assert held["longest_stall_s"] == pytest.approx(18.3 - 10.26 + CLIENT_S)
    assert held["fault_to_next_start_s"] == held["end_to_next_start_s"] == TARGET_S
    assert held["enqueue_longest_without_puback_s"] == TARGET_S
    assert limits({**measured, "consumer_elections_after_fault_s": []})["longest_stall_s"] == (
        TARGET_S
    )
    # The clients took a second longer than CLIENT_S after the election: past the target.
    until = 18.3 + CLIENT_S + 1
    late = {**measured, "longest_stall_after_fault_s": [10.26, until]}
    assert limits({**late, "longest_stall_s": until - 10.26})["longest_stall_s"] < until - 10.26


def test_a_figure_fails_the_test_at_twice_its_target() -> None:
    """A figure past its target is reported as missed; the test fails it at HELD_FACTOR times
    the target (a busy machine makes the workers' timers late, not twice as late)."""
    measured = {
        "jobs": {"lost": 0, "never_enqueued": []},
        "workers": [],
        "fault_s": 10.0,
        "longest_stall_after_fault_s": [0.5, 6.0],
        "fault_to_next_start_s": 0.5,
        "end_to_next_start_s": 0.1,
        "enqueue_longest_without_puback_s": 1.0,
        "consumer_elections_after_fault_s": [],
        "stream_elected_after_fault_s": None,
    }
    missed = {**measured, "longest_stall_s": TARGET_S + 1}
    assert problems(missed) == []
    assert verdict(TARGET_S + 1, TARGET_S) == "missed" and verdict(1.0, TARGET_S) == "met"
    failed = {**measured, "longest_stall_s": HELD_FACTOR * TARGET_S}
    assert problems(failed) == [f"longest_stall_s = 10.0 (held to < {2 * TARGET_S:.2f} s)"]
    assert verdict(None, TARGET_S) == "failed"
