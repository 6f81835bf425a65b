"""The README and the guide cannot rot: every relative link and every backticked path in them
names a file or folder of this repository, and no tracked file points to a document outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "ecosystem/README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
# `app/jobs/email.py`, `mega/jobs/`, `bench/RESULTS.md`: a relative path with a folder in it.
PATH = re.compile(r"`((?:\.?[\w-]+/)+[\w.-]*)`")
# Paths that exist only once the demo has run (data of the embedded servers, screenshots).
MADE_AT_RUN_TIME = ("var/", "artifacts/")
# The name of a document users of the repository do not have, as every reference to it was
# written (a whole, upper-case word); built from parts so that this file does not name it.
OUTSIDE_DOCUMENT = re.compile(r"\b" + "SP" + "EC" + r"\b")


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


def tracked_text_files() -> list[Path]:
    """Every file git tracks that is text (not a PNG or other binary, which has a NUL byte)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    files = []
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if path.is_file() and b"\0" not in path.read_bytes():
            files.append(path)
    return files


def test_no_file_points_outside_the_repository() -> None:
    files = tracked_text_files()
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in files
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE_DOCUMENT.search(line)
    ]
    assert len(files) > 100 and ROOT / "tests/ops/test_docs.py" in files
    assert found == [], f"these lines name a document outside the repository: {found}"
