"""`pip install mega-py` alone, in a fresh virtualenv: the framework without its web side.
`import mega` and a job run through the memory driver, nothing of the web stack is installed
or imported, and a web command says which extra it needs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

WEB_STACK = ("fastapi", "uvicorn", "jinja2", "python-multipart", "itsdangerous", "pwdlib")
A_JOB = textwrap.dedent(
    """
    import asyncio, sys
    from mega import Job, JobQueue
    from mega.testing import drain, memory_context

    WEB = ("fastapi", "jinja2", "uvicorn", "starlette", "mega.web")

    class Hello(Job):
        subject = "lean.hello"
        bus = "jobs"
        async def run(self, payload, ctx):
            print("hello", payload["to"])

    async def main():
        ctx = memory_context("jobs")
        await JobQueue(ctx, "jobs").enqueue(Hello, {"to": "ada"})
        report = await drain(ctx, jobs=[Hello])
        print("done", report.count("Hello", "done"))
        web = sorted(name for name in sys.modules if name.startswith(WEB))
        print("web modules", web)

    asyncio.run(main())
    """
)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mega_py_alone_runs_a_job_without_the_web_stack(
    tmp_path: Path, checkout_copy: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(checkout_copy),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    listing = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.lower()
    packages = [line.split("==")[0] for line in listing.splitlines()]
    assert "mega-py" in packages
    assert [name for name in WEB_STACK if name in packages] == []
    print(f"\nmega-py alone: {len(packages)} packages")  # the figure the docs quote

    ran = subprocess.run(
        [str(python), "-c", A_JOB], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.splitlines() == ["hello ada", "done 1", "web modules []"]

    mega = venv / "bin" / "mega"
    assert (
        subprocess.run([str(mega), "worker", "--help"], capture_output=True, timeout=60).returncode
        == 0
    )
    start = subprocess.run(
        [str(mega), "start", "--config", str(tmp_path / "none.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert start.returncode == 2
    assert start.stderr.strip().endswith("pip install 'mega-py[web]'"), start.stderr
