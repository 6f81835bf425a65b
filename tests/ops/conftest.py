"""Fixtures of the tests that install this checkout as a user would."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What `.gitignore` keeps out of the repository: local state, caches and earlier builds.
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".venv-peers",
    "var",
    "artifacts",
    "build",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".import_linter_cache",
    ".coverage*",
)


@pytest.fixture
def checkout_copy(tmp_path: Path) -> Path:
    """A copy of this checkout's source for `pip install` to build from. pip builds in the
    source tree (its `build/` and `*.egg-info`), so two installs of the checkout itself at the
    same time, on two xdist workers, would write over each other's wheel."""
    copy = tmp_path / "mega-py"
    shutil.copytree(ROOT, copy, ignore=NOT_SOURCE, symlinks=True)
    return copy
