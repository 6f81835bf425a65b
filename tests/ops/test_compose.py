"""docker-compose.yml and the Dockerfile, read as data: Docker itself is not needed.

The app containers must run the same three commands the tests run (`live_stack` starts
`mega start`, `mega scheduler`, `mega worker`), wait for healthy services, and the image must
install its dependencies before the source and run as a non-root user."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MEGA_SERVICES = ("app", "scheduler", "worker")


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    result: dict[str, dict[str, Any]] = compose["services"]
    return result


def command(service: dict[str, Any]) -> list[str]:
    value = service["command"]
    return shlex.split(value) if isinstance(value, str) else list(value)


def test_every_service_is_there(services: dict[str, dict[str, Any]]) -> None:
    assert sorted(services) == [
        "app",
        "migrate",
        "nats",
        "nats-1",
        "nats-2",
        "nats-3",
        "postgres",
        "redis",
        "scheduler",
        "work",
        "worker",
    ]


def test_the_single_layout_runs_one_mega_work(services: dict[str, dict[str, Any]]) -> None:
    work = services["work"]
    assert work["profiles"] == ["single"]  # off unless asked for: `--profile single`
    assert command(work) == ["mega", "work", "--with-scheduler"]
    assert work["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    assert "http://127.0.0.1:9102/metrics" in " ".join(work["healthcheck"]["test"])


def test_migrations_run_once_before_the_web_app(services: dict[str, dict[str, Any]]) -> None:
    assert command(services["migrate"]) == ["mega", "db", "upgrade"]
    assert services["migrate"]["restart"] == "no"
    assert services["app"]["depends_on"]["migrate"] == {
        "condition": "service_completed_successfully"
    }


def test_app_containers_run_the_commands_the_tests_run(
    services: dict[str, dict[str, Any]],
) -> None:
    assert command(services["app"]) == ["mega", "start", "--host", "0.0.0.0", "--port", "8000"]
    assert command(services["scheduler"]) == ["mega", "scheduler"]
    assert command(services["worker"]) == ["mega", "worker"]
    assert services["app"]["ports"] == ["${MEGA_PORT:-8000}:8000"]  # 8000 unless MEGA_PORT
    for name in MEGA_SERVICES:
        assert services[name]["build"] == ".", name


def test_scheduler_and_worker_run_two_replicas(services: dict[str, dict[str, Any]]) -> None:
    assert services["scheduler"]["deploy"]["replicas"] == 2
    assert services["worker"]["deploy"]["replicas"] == 2


def test_app_waits_for_every_backing_service_to_be_healthy(
    services: dict[str, dict[str, Any]],
) -> None:
    assert services["app"]["depends_on"] == {
        "nats": {"condition": "service_healthy"},
        "redis": {"condition": "service_healthy"},
        "postgres": {"condition": "service_healthy"},
        "migrate": {"condition": "service_completed_successfully"},
    }
    for name, service in services.items():
        for dependency, options in service.get("depends_on", {}).items():
            if dependency != "migrate":  # a one-shot: it completes, it is never healthy
                assert options == {"condition": "service_healthy"}, (name, dependency)


def test_the_cluster_profile_runs_three_routed_jetstream_nodes(
    services: dict[str, dict[str, Any]],
) -> None:
    names = ("nats-1", "nats-2", "nats-3")
    for name in names:
        node = services[name]
        args = command(node)
        assert node["profiles"] == ["cluster"] and node["volumes"] == [f"{name}-data:/data"]
        assert args[:3] == ["-js", "-sd", "/data"] and args[args.index("-n") + 1] == name
        assert args[args.index("--cluster_name") + 1] == "mega"
        routes = args[args.index("--routes") + 1].split(",")
        assert sorted(routes) == [f"nats://{other}:6222" for other in names if other != name]
        assert "js-enabled-only" in " ".join(node["healthcheck"]["test"])


def test_every_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if name != "migrate":  # a one-shot command
            assert service["healthcheck"]["test"], name
    assert services["nats"]["healthcheck"]["test"] == [
        "CMD",
        "wget",
        "-qO-",
        "http://localhost:8222/healthz",
    ]
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert "http://127.0.0.1:8000/readyz" in " ".join(services["app"]["healthcheck"]["test"])
    # The scheduler and worker serve no web page: their metrics port shows they are up.
    for name, port_variable in (
        ("scheduler", "MEGA_SCHEDULER_METRICS_PORT"),
        ("worker", "MEGA_WORKER_METRICS_PORT"),
    ):
        port = services[name]["environment"][port_variable]
        check = " ".join(services[name]["healthcheck"]["test"])
        assert f"http://127.0.0.1:{port}/metrics" in check, name


def test_hosts_get_longer_than_their_drain_to_stop(services: dict[str, dict[str, Any]]) -> None:
    # The hosts wait up to 30 s for running ticks and in-flight jobs; Docker's default is 10 s.
    grace_s = {
        name: int(services[name]["stop_grace_period"].removesuffix("s")) for name in MEGA_SERVICES
    }
    assert grace_s == {"app": 40, "scheduler": 45, "worker": 45}


def test_nats_runs_jetstream_on_a_named_volume(services: dict[str, dict[str, Any]]) -> None:
    nats = services["nats"]
    assert command(nats) == ["-js", "-sd", "/data", "-m", "8222"]
    assert nats["volumes"] == ["nats-data:/data"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert "nats-data" in compose["volumes"]


def test_postgres_matches_the_apps_database_url(services: dict[str, dict[str, Any]]) -> None:
    assert services["postgres"]["environment"] == {
        "POSTGRES_USER": "mega",
        "POSTGRES_PASSWORD": "mega",
        "POSTGRES_DB": "mega",
    }
    assert (
        services["app"]["environment"]["DATABASE_URL"]
        == "postgresql://mega:mega@postgres:5432/mega"
    )


def test_mega_containers_get_their_urls_and_secrets_from_the_environment(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in MEGA_SERVICES:
        env = services[name]["environment"]
        assert env["NATS_URL"] == "${NATS_URL:-nats://nats:4222}", name
        assert env["MEGA_REPLICAS"] == "${MEGA_REPLICAS:-1}", name
        assert env["REDIS_URL"] == "redis://redis:6379/0", name
        assert env["DATABASE_URL"] == "postgresql://mega:mega@postgres:5432/mega", name
        # Secrets have no default outside dev: compose stops with this message until set.
        assert env["MEGA_SECRET_KEY"].startswith("${MEGA_SECRET_KEY:?"), name
        assert env["MEGA_DEMO_PASSWORD"].startswith("${MEGA_DEMO_PASSWORD:?"), name
        assert "MEGA_DEMO_USER" in env, name


# -- Dockerfile --------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, with continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), " ".join(rest.split())))
    return instructions


def test_dockerfile_base_port_and_default_command() -> None:
    instructions = dockerfile_instructions()
    assert instructions[0] == ("FROM", "python:3.11-slim")
    assert ("EXPOSE", "8000") in instructions
    assert instructions[-1] == ("CMD", '["mega", "start", "--host", "0.0.0.0", "--port", "8000"]')
    healthchecks = [args for keyword, args in instructions if keyword == "HEALTHCHECK"]
    assert len(healthchecks) == 1
    assert "python" in healthchecks[0] and "http://127.0.0.1:8000/healthz" in healthchecks[0]


def test_dockerfile_installs_dependencies_before_copying_the_source() -> None:
    instructions = dockerfile_instructions()
    copies = [i for i, (keyword, _) in enumerate(instructions) if keyword == "COPY"]
    installs = [
        i
        for i, (keyword, args) in enumerate(instructions)
        if keyword == "RUN" and "pip install" in args
    ]
    assert [instructions[i][1] for i in copies] == ["pyproject.toml ./", ". ."]
    assert len(installs) == 2
    deps, package = installs
    # pyproject.toml alone, its dependencies, then the source, then the package without deps.
    assert copies[0] < deps < copies[1] < package
    assert "--no-deps" not in instructions[deps][1]
    assert "pip install --no-deps" in instructions[package][1]


def test_dockerfile_runs_as_a_non_root_user() -> None:
    instructions = dockerfile_instructions()
    users = [(i, args) for i, (keyword, args) in enumerate(instructions) if keyword == "USER"]
    assert len(users) == 1
    index, user = users[0]
    assert user not in ("root", "0", "0:0")
    assert any(
        keyword == "RUN" and "useradd" in args and user in args.split()
        for keyword, args in instructions[:index]
    )
    # Nothing after USER needs root: every install happened before it.
    assert [keyword for keyword, _ in instructions[index:]] == [
        "USER",
        "EXPOSE",
        "HEALTHCHECK",
        "CMD",
    ]


def test_dockerignore_keeps_local_state_out_of_the_image() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    assert {".venv", "var", ".git", "artifacts", "**/__pycache__"} <= patterns


# Keys both compose implementations read the same way: Debian's docker-compose 1.29 and the
# `docker compose` plugin (v2). A key outside them (`develop`, `deploy.resources`, which 1.29
# reads only with --compatibility) would make the layouts differ between the two.
SHARED_SERVICE_KEYS = {
    "build",
    "image",
    "init",
    "restart",
    "environment",
    "command",
    "ports",
    "depends_on",
    "healthcheck",
    "stop_grace_period",
    "deploy",
    "profiles",
    "volumes",
}


def test_the_compose_file_uses_only_keys_both_compose_versions_read() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert set(compose) == {"x-mega", "services", "volumes"}  # no `version`: v2 calls it obsolete
    for name, service in compose["services"].items():
        assert set(service) <= SHARED_SERVICE_KEYS, (name, set(service) - SHARED_SERVICE_KEYS)
        assert set(service.get("deploy", {})) <= {"replicas"}, name
        for options in service.get("depends_on", {}).values():
            assert options["condition"] in ("service_healthy", "service_completed_successfully")
