"""`mega check`'s findings, one config file per case: no server is reached by any of them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mega.config import Config, load_config
from mega.errors import ConfigError
from mega.runtime.check import Finding, check_config, enforce, summary
from tests.factories import DECLARATIONS, write_config

ROOT = Path(__file__).resolve().parents[3]
# Nothing listens there: a check that connected would fail.
NATS_URL, REDIS_URL = "nats://127.0.0.1:1", "redis://127.0.0.1:1/0"


def config_of(tmp_path: Path, body: str, *, redis: bool = True) -> Config:
    path = write_config(
        tmp_path, nats_url=NATS_URL, redis_url=REDIS_URL if redis else None, body=body
    )
    return load_config(path)


def lines(findings: list[Finding]) -> list[str]:
    return [str(finding) for finding in findings]


def test_a_good_config_has_no_finding(tmp_path: Path) -> None:
    config = config_of(tmp_path, DECLARATIONS)
    assert check_config(config) == []
    assert summary(config, []) == (
        "mega check: 1 schedule, 1 job, 1 worker, 1 event, 1 listener ok"
    )


def test_the_sample_config_passes_with_no_finding() -> None:
    config = load_config(ROOT / "mega_config.py", signs=False)
    assert check_config(config) == []


def test_a_bad_cron_is_an_error_naming_the_schedule(tmp_path: Path) -> None:
    config = config_of(tmp_path, DECLARATIONS + "Tidy.cron = '61 * * * *'\n")
    [finding] = check_config(config)
    assert finding.level == "error" and finding.subject == "schedules: Tidy"
    assert "cron: invalid cron expression '61 * * * *'" in finding.message


def test_a_schedule_on_an_undeclared_lock_is_an_error_with_its_fix(tmp_path: Path) -> None:
    [on_a_cache] = check_config(
        config_of(tmp_path, DECLARATIONS + "services = {**services, 'locks': {}}\n")
    )
    [on_nothing] = check_config(config_of(tmp_path, DECLARATIONS, redis=False))
    for finding in (on_a_cache, on_nothing):
        assert finding.subject == "schedules: Tidy"
        assert "alias 'main' is not declared (declared: none)" in finding.message
    assert "'main' is a cache, not a lock: declare one on it, services.locks" in on_a_cache.message
    assert "is a cache" not in on_nothing.message


def test_an_untagged_lock_key_on_a_redis_cluster_is_an_error_with_its_fix(tmp_path: Path) -> None:
    cache = "{'driver': 'redis', 'url': 'redis+cluster://127.0.0.1:1'}"
    on_cluster = f"services['caches'] = {{'main': {cache}}}\n"
    untagged = "Tidy.lock = {'lock': 'main', 'ttl': 20_000, 'key': 'mine:tidy'}\n"
    [finding] = check_config(config_of(tmp_path, DECLARATIONS + on_cluster + untagged))
    assert finding.subject == "schedules: Tidy"
    assert "lock key 'mine:tidy' has no hash tag" in finding.message
    assert "tag the key, e.g. '{mine:tidy}'" in finding.message
    tagged = untagged.replace("mine:tidy", "{mine:tidy}")
    assert check_config(config_of(tmp_path, DECLARATIONS + on_cluster + tagged)) == []
    assert check_config(config_of(tmp_path, DECLARATIONS + on_cluster)) == []  # the default key
    assert check_config(config_of(tmp_path, DECLARATIONS + untagged)) == []  # one Redis


def test_every_bad_field_of_a_job_is_on_its_line(tmp_path: Path) -> None:
    body = DECLARATIONS + "Email.bus = 'nope'\nEmail.retries = True\n"
    [finding] = check_config(config_of(tmp_path, body))
    assert finding.subject == "jobs: Email"
    assert "'nope' is not a declared bus alias (declared: jobs)" in finding.message
    assert "retries: must be an int >= 0, got True" in finding.message


@pytest.mark.parametrize(
    ("body", "subject", "expected"),
    [
        ("jobs = [Email, Email]", "jobs: Email", "listed twice"),
        (
            "class Twin(Welcome):\n    group = 'Welcome'\nlisteners = [Welcome, Twin]",
            "listeners: Twin",
            "has the group of Welcome ('Welcome')",
        ),
        (
            "class Other(Hash):\n    name = 'Hash'\nworkers = [Hash, Other]",
            "workers: Other",
            "has the name of Hash ('Hash')",
        ),
        (
            "class Again(Tidy):\n    name = 'Tidy'\nschedules = [Tidy, Again]",
            "schedules: Again",
            "has the name of Tidy ('Tidy')",
        ),
    ],
)
def test_a_duplicate_is_an_error(tmp_path: Path, body: str, subject: str, expected: str) -> None:
    [finding] = check_config(config_of(tmp_path, DECLARATIONS + body + "\n"))
    assert (finding.level, finding.subject) == ("error", subject)
    assert expected in finding.message


def test_a_worker_that_is_not_a_worker_class_is_an_error(tmp_path: Path) -> None:
    [finding] = check_config(config_of(tmp_path, DECLARATIONS + "workers = [Email]\n"))
    assert str(finding) == "error: workers: Email: a worker must be a subclass of mega.Worker"


def test_a_job_of_the_project_missing_from_jobs_is_a_warning(tmp_path: Path) -> None:
    package = tmp_path / "shop_check"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text(
        "from mega import Job\n"
        "class Shared(Job):\n    bus = 'jobs'\n    async def run(self, payload, ctx): pass\n"
        "class SendReceipt(Shared):\n    subject = 'shop.receipt'\n"
        "class Forgotten(Shared):\n    subject = 'shop.forgotten'\n"
    )
    body = (
        "from shop_check.jobs import SendReceipt\n"
        "class Unlisted(SendReceipt):\n    subject = 'shop.unlisted'\n"
        "jobs = [SendReceipt]\n"
    )
    try:
        findings = check_config(config_of(tmp_path, body))
    finally:
        for name in ("shop_check", "shop_check.jobs"):
            sys.modules.pop(name, None)
    # Not Shared: it names no subject. Nor the jobs of other configs of this test run.
    assert [(f.level, f.subject) for f in findings] == [
        ("warning", "jobs: Unlisted"),
        ("warning", "jobs: Forgotten"),
    ]
    assert findings[1].message.startswith("a Job of shop_check.jobs that `jobs` does not list")
    assert "add Forgotten to `jobs`" in findings[1].message


def test_a_listener_on_an_event_missing_from_events_is_a_warning(tmp_path: Path) -> None:
    body = (
        DECLARATIONS
        + "class Other(Event):\n    name = 'other'\n    bus = 'jobs'\nevents = [Other]\n"
    )
    assert lines(check_config(config_of(tmp_path, body))) == [
        "warning: events: Other: no listener hears 'other': its events are relayed and kept "
        "for a group that may come later; add a Listener to `listeners`, or drop it from "
        "`events`",
        "warning: listeners: Welcome: hears Signup, which `events` does not declare: it is "
        "never checked, and a worker relays the outbox only when `events` declares some; add "
        "Signup to `events`",
    ]


@pytest.mark.parametrize(
    ("pattern", "heard"),
    [("user.*", True), ("user.>", True), (">", True), ("user", False), ("order.*", False)],
)
def test_a_pattern_listener_warns_when_no_declared_event_matches(
    tmp_path: Path, pattern: str, heard: bool
) -> None:
    body = DECLARATIONS + f"Welcome.event = {pattern!r}\nWelcome.bus = 'jobs'\n"
    warned = [f.subject for f in check_config(config_of(tmp_path, body))]
    assert warned == ([] if heard else ["events: Signup", "listeners: Welcome"])


def test_listeners_with_no_events_warn_that_no_relay_runs(tmp_path: Path) -> None:
    findings = check_config(config_of(tmp_path, DECLARATIONS + "events = []\n"))
    assert [f.subject for f in findings] == ["listeners: Welcome", "events"]
    assert "`mega worker` runs no outbox relay" in findings[1].message
    assert all(f.level == "warning" for f in findings)


def test_events_with_the_relay_off_warn(tmp_path: Path) -> None:
    [finding] = check_config(config_of(tmp_path, DECLARATIONS + "outbox = {'relay': False}\n"))
    assert finding.subject == "outbox" and "no worker of this config relays" in finding.message


def test_every_problem_is_found_at_once(tmp_path: Path) -> None:
    body = DECLARATIONS + "Tidy.cron = 'x'\nEmail.bus = 'nope'\nHash.mode = 'fork'\n"
    config = config_of(tmp_path, body)
    findings = check_config(config)
    assert [f.subject for f in findings] == ["schedules: Tidy", "jobs: Email", "workers: Hash"]
    assert summary(config, findings) == "mega check: 3 errors, 0 warnings"


def test_enforce_raises_every_error_and_passes_each_warning_on(tmp_path: Path) -> None:
    warned: list[str] = []
    enforce(config_of(tmp_path, DECLARATIONS + "events = []\n"), warned.append)
    assert len(warned) == 2
    with pytest.raises(ConfigError) as raised:
        enforce(config_of(tmp_path, DECLARATIONS + "Tidy.cron = 'x'\nEmail.bus = 'nope'\n"), print)
    assert raised.value.message.startswith("2 problems in mega_config.py:\n  error: schedules")
    assert "\n  error: jobs: Email: " in raised.value.message


@pytest.mark.parametrize(
    ("events", "relay", "runs"),
    [(True, None, True), (False, None, False), (False, True, True), (True, False, False)],
)
def test_the_worker_relays_the_outbox_for_events_or_when_told(
    tmp_path: Path, events: bool, relay: bool | None, runs: bool
) -> None:
    """The relay runs in `mega worker` when the config declares events, or `outbox.relay` is
    True (jobs enqueued through the outbox, no events); never when it is False."""
    from mega.runtime.hosts import relays, worker_parts

    body = DECLARATIONS + ("" if events else "events = []\nlisteners = []\n")
    if relay is not None:
        body += f'outbox = {{"relay": {relay}}}\n'
    config = config_of(tmp_path, body)
    assert bool(config.events) is events
    assert relays(config) is runs
    assert ("relay" in [part.hook for part in worker_parts(config)]) is runs
