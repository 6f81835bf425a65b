"""Where the pages send a learner who asks "how does this work?": a read-only view of the
project's own source files, and the guide's chapters rendered from docs/guide/.

Only text files under a few top-level folders are shown, resolved inside the project (no `..`,
no symlink out); anything else is a 404. A chapter's relative links become links to the pages
that show their targets (app/services/guide_markdown.py).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import FileResponse, RedirectResponse

from app.services.guide_markdown import render_chapter
from mega.web import UserDep, render

router = APIRouter(include_in_schema=False)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
GUIDE = PROJECT_ROOT / "docs" / "guide"
SOURCE_FOLDERS = ("app", "mega", "static", "templates", "docs", "tests", "bench", "ecosystem")
SOURCE_FILES = ("mega_config.py", "Makefile", "docker-compose.yml", "Dockerfile", "pyproject.toml")
SOURCE_SUFFIXES = (
    ".py",
    ".js",
    ".css",
    ".html",
    ".md",
    ".toml",
    ".yml",
    ".yaml",
    ".mako",
    ".service",
    ".conf",
)
CHAPTERS = (
    ("index", "Start here"),
    ("schedules", "Schedules"),
    ("jobs", "Jobs"),
    ("events", "Events"),
    ("drivers", "Bus drivers"),
    ("workers", "CPU workers"),
    ("testing", "Testing"),
    ("scaling", "Scaling out"),
    ("operating", "Operating"),
    ("http", "HTTP"),
)
IMAGE = re.compile(r"^[a-z0-9][a-z0-9_-]*\.png$")


def source_file(path: str) -> Path | None:
    """The project file `path` names, if it is one the source view may show."""
    if not path or not path.isprintable() or path.startswith("/") or "\\" in path:
        return None  # a NUL byte (which the file system refuses with a ValueError) included
    if ".." in path.split("/"):
        return None
    candidate = (PROJECT_ROOT / path).resolve()
    if not candidate.is_relative_to(PROJECT_ROOT) or not candidate.is_file():
        return None
    relative = candidate.relative_to(PROJECT_ROOT)
    allowed = relative.parts[0] in SOURCE_FOLDERS or str(relative) in SOURCE_FILES
    return candidate if allowed and candidate.suffix in (*SOURCE_SUFFIXES, "") else None


@router.get("/demo/source")
async def source(request: Request, user: UserDep, path: str = "") -> Response:
    found = source_file(path)
    if found is None:
        raise HTTPException(404, f"no source file {path!r} to show")
    lines = found.read_text(encoding="utf-8", errors="replace").splitlines()
    return render(request, "source.html", {"title": path, "source_path": path, "lines": lines})


@lru_cache(maxsize=16)
def _chapter_html(path: Path, mtime_ns: int) -> str:
    return render_chapter(
        path.read_text("utf-8"),
        chapter_dir=GUIDE,
        root=PROJECT_ROOT,
        chapters=[name for name, _ in CHAPTERS],
        shows_source=lambda p: source_file(p) is not None,
    )


@router.get("/demo/guide")
async def guide_start(user: UserDep) -> Response:
    return RedirectResponse("/demo/guide/index", status_code=303)


@router.get("/demo/guide/{chapter}")
async def guide(request: Request, user: UserDep, chapter: str) -> Response:
    names = dict(CHAPTERS)
    path = GUIDE / f"{chapter}.md"
    if chapter not in names or not path.is_file():
        raise HTTPException(404, f"no guide chapter {chapter!r}")
    html = _chapter_html(path, path.stat().st_mtime_ns)
    context = {
        "title": f"Guide: {names[chapter]}",
        "chapter": chapter,
        "chapters": CHAPTERS,
        "html": html,
    }
    return render(request, "guide.html", context)


@router.get("/demo/guide/img/{name}")
async def guide_image(user: UserDep, name: str) -> Response:
    path = GUIDE / "img" / name
    if not IMAGE.match(name) or not path.is_file():
        raise HTTPException(404, f"no guide image {name!r}")
    return FileResponse(path, media_type="image/png")
