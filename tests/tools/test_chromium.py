"""tests/tools/chromium.sh, run by `make test` before the tests: it names the Chromium the
browser tests will drive, or stops with one line saying how to get one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).with_name("chromium.sh")


def find(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ["PATH"], **env},
    )


def test_the_chromium_named_by_mega_chromium_is_used(tmp_path: Path) -> None:
    browser = tmp_path / "my-chromium"
    browser.write_text("#!/bin/sh\n")
    browser.chmod(0o755)
    found = find(tmp_path, MEGA_CHROMIUM=str(browser))
    assert (found.returncode, found.stdout.strip()) == (0, str(browser))


def test_one_on_the_path_is_found(tmp_path: Path) -> None:
    (tmp_path / "chromium").write_text("#!/bin/sh\n")
    (tmp_path / "chromium").chmod(0o755)
    found = find(tmp_path, PATH=f"{tmp_path}:/usr/bin:/bin")
    assert found.returncode == 0
    assert found.stdout.strip() in (str(tmp_path / "chromium"), "/usr/bin/chromium")


def test_a_wrong_mega_chromium_stops_with_one_line(tmp_path: Path) -> None:
    found = find(tmp_path, MEGA_CHROMIUM=str(tmp_path / "nothing"))
    assert found.returncode == 1 and found.stdout == ""
    assert (
        found.stderr
        == f"make test: MEGA_CHROMIUM={tmp_path / 'nothing'} is not an executable file\n"
    )
