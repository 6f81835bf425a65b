"""Browser tests: the real hosts as subprocesses, driven by Debian's headless Chromium.

Screenshots of every page land in ./artifacts/screenshots (git ignores it) for people to look at;
with MEGA_GUIDE_SCREENSHOTS=1 (`make screenshots`) those the guide shows also go to docs/guide/img.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from mega.drivers.embedded import free_port
from mega.drivers.nats.embedded import EmbeddedNats
from mega.drivers.redis.embedded import EmbeddedRedis
from tests.factories import DEMO_PASSWORD, DEMO_USER, TEST_SECRET
from tests.processes import unmeasured_env

if TYPE_CHECKING:
    from playwright.sync_api import Browser, FloatRect, Page

ROOT = Path(__file__).resolve().parents[2]
# `make test` finds one first (tests/tools/chromium.sh) and passes it here.
CHROMIUM = os.environ.get("MEGA_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
GUIDE = ROOT / "docs" / "guide"
GUIDE_IMAGES = GUIDE / "img"
SCREENSHOT_MAX_HEIGHT_PX = 8_000
GUIDE_MAX_HEIGHT_PX = 1600
# The live stack's demo schedule ticks this often (its default is every 30 s), so the tests that
# wait for a tick wait seconds; `make screenshots` keeps the default the guide describes.
TICK_S = 5
# What a page does alike on every bus runs on the NATS stack alone: its layout at each width,
# its field errors, the focus it keeps, the API's contract, and the schedules (which use Redis
# whatever the bus). What it shows of jobs and events run on the bus runs on both stacks.
ONE_BUS = pytest.mark.parametrize("live_stack", ["nats"], indirect=True)


@dataclass
class LiveStack:
    url: str
    processes: dict[str, subprocess.Popen[bytes]]
    log_dir: Path

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}\n{(self.log_dir / f'{name}.log').read_text(errors='replace')[-4000:]}"
            for name in self.processes
        )


def _wait_http(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer")


@pytest.fixture(scope="session", params=["nats", "redis"])
def live_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveStack]:
    """`mega start`, `mega scheduler` and `mega worker` with the real mega_config.py, its URLs
    and secrets from the environment: the app exactly as an operator runs it. It has servers of
    its own, so its ticking scheduler never touches another test's keys. A page test runs
    twice, jobs and events on NATS, then on Redis (`MEGA_BUS=redis`, what `make run BUS=redis`
    sets), but for one that narrows `live_stack` to one bus (`ONE_BUS`: what a page does alike
    on every bus; the worker page, whose CPU pool touches none)."""
    tmp = tmp_path_factory.mktemp(f"live-{request.param}")
    nats_server = EmbeddedNats(data_dir=tmp / "nats").start()
    redis_server = EmbeddedRedis(data_dir=tmp / "redis").start()
    port = free_port()
    # The hosts run unmeasured (unmeasured_env): coverage's tracing of three hosts per stack,
    # each serving a live page for minutes, was a third of their CPU.
    env = {
        **unmeasured_env(),
        "NATS_URL": nats_server.url,
        "REDIS_URL": redis_server.url,
        "DATABASE_URL": f"sqlite:///{tmp / 'live.db'}",
        "MEGA_SECRET_KEY": TEST_SECRET,
        "MEGA_DEMO_USER": DEMO_USER,
        "MEGA_DEMO_PASSWORD": DEMO_PASSWORD,
        "MEGA_SCHEDULER_METRICS_PORT": str(free_port()),
        "MEGA_WORKER_METRICS_PORT": str(free_port()),
        "MEGA_BUS": request.param,
    }
    if os.environ.get("MEGA_GUIDE_SCREENSHOTS") != "1":  # the guide's pictures: as shipped
        env["MEGA_DEMO_CRON"] = f"*/{TICK_S} * * * * *"
    commands = {
        "web": ["start", "--port", str(port)],
        "scheduler": ["scheduler"],
        "worker": ["worker"],
    }
    processes = {}
    for name, args in commands.items():
        log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
        processes[name] = subprocess.Popen(
            [sys.executable, "-m", "mega", *args, "--config", str(ROOT / "mega_config.py")],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
    stack = LiveStack(f"http://127.0.0.1:{port}", processes, tmp)
    try:
        _wait_http(stack.url + "/healthz")
        yield stack
    finally:
        for process in processes.values():
            process.terminate()
        for name, process in processes.items():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                print(f"{name} did not stop within 30 s of SIGTERM: killed")
                process.kill()
                process.wait(10)  # reaped: a Popen dropped while running warns at collection
        nats_server.stop()
        redis_server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Per module: Playwright's sync API keeps an event loop running while it is open, which
    must not overlap the asyncio tests that run after the browser tests."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield chromium
        chromium.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[FAILED] = report.failed
    return report


FAILED = pytest.StashKey[bool]()


@pytest.fixture
def page(browser: Browser, live_stack: LiveStack, request: pytest.FixtureRequest) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    if request.node.stash.get(FAILED, False):
        screenshot(page, f"failed-{request.node.name}")
        print(live_stack.logs())  # the hosts' own account of what happened
    context.close()


def log_in(page: Page, url: str) -> None:
    page.goto(url + "/demo")
    page.fill("input[name=username]", DEMO_USER)
    page.fill("input[name=password]", DEMO_PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/demo")


def screenshot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # Animations stopped (a live page always has one running) and a minute, not 30 s: on two
    # busy cores a full-page capture has waited out the default for a stable frame.
    # A page taller than SCREENSHOT_MAX_HEIGHT_PX (a long guide chapter) is taken as the reader
    # first sees it: for a full-page capture Chromium grows its window to the whole height,
    # which for tens of thousands of pixels takes longer than the timeout.
    tall = page.evaluate("document.documentElement.scrollHeight") > SCREENSHOT_MAX_HEIGHT_PX
    page.screenshot(
        path=str(SCREENSHOTS / f"{name}.png"),
        full_page=not tall,
        animations="disabled",
        timeout=60_000,
    )
    if os.environ.get("MEGA_GUIDE_SCREENSHOTS") == "1" and name in guide_images():
        # The page as a reader sees it, cut at GUIDE_MAX_HEIGHT_PX so the committed PNGs stay
        # small (a page with a long list would otherwise be several megabytes).
        GUIDE_IMAGES.mkdir(exist_ok=True)
        height = min(page.evaluate("document.documentElement.scrollHeight"), GUIDE_MAX_HEIGHT_PX)
        viewport = page.viewport_size
        assert viewport is not None  # every context here is made with one
        clip: FloatRect = {"x": 0, "y": 0, "width": viewport["width"], "height": height}
        page.screenshot(path=str(GUIDE_IMAGES / f"{name}.png"), full_page=True, clip=clip)


def guide_images() -> set[str]:
    """The screenshots the guide shows (`![...](img/<name>.png)` in docs/guide/*.md): `make
    screenshots` (MEGA_GUIDE_SCREENSHOTS=1) refreshes exactly those, so a plain test run never
    touches the tree."""
    shown = (re.findall(r"\]\(img/([\w-]+)\.png\)", p.read_text()) for p in GUIDE.glob("*.md"))
    return {name for names in shown for name in names}
