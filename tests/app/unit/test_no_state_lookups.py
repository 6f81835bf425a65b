"""The sample reaches the framework through `Annotated` dependencies (app/deps.py), never by
looking names up on the app's state."""

from __future__ import annotations

from pathlib import Path

APP = Path(__file__).resolve().parents[3] / "app"


def test_no_route_reads_the_app_state() -> None:
    found = [
        f"{path.relative_to(APP.parent)}:{number}: {line.strip()}"
        for path in sorted(APP.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "app.state" in line
    ]
    assert not found, "use a dependency of app/deps.py instead:\n" + "\n".join(found)
