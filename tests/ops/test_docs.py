"""The README and the guide cannot rot: every relative link and every backticked path in them
names a file or folder of this repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "ecosystem/README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
# `app/jobs/email.py`, `mega/jobs/`, `bench/RESULTS.md`: a relative path with a folder in it.
PATH = re.compile(r"`((?:\.?[\w-]+/)+[\w.-]*)`")
# Paths that exist only once the demo has run (data of the embedded servers, screenshots).
MADE_AT_RUN_TIME = ("var/", "artifacts/")


def references(doc: Path) -> list[tuple[str, Path]]:
    text = doc.read_text()
    found = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        found.append((target, (doc.parent / target.split("#")[0]).resolve()))
    for target in PATH.findall(text):
        # A path into one of our top-level folders (not `application/json`, `Asia/Seoul`).
        if (ROOT / target.split("/")[0]).is_dir() and not target.startswith(MADE_AT_RUN_TIME):
            found.append((target, (ROOT / target).resolve()))
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_reference_resolves(doc: Path) -> None:
    missing = [target for target, path in references(doc) if not path.exists()]
    assert missing == [], f"{doc.relative_to(ROOT)} names what does not exist: {missing}"


def test_the_docs_are_scanned() -> None:
    assert len(DOCS) >= 6 and sum(len(references(doc)) for doc in DOCS) > 20
