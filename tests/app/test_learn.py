"""The source view and the guide pages the demos link to: login-gated, confined to the
project's own text files, chapters rendered with their links rewritten and raw HTML off."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.routes.learn import CHAPTERS, GUIDE, source_file
from tests.factories import login, sample_config_for, web_client


async def test_source_and_guide_pages_are_for_logged_in_users(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    config = sample_config_for(tmp_path, nats_url, redis_url)
    async with web_client(config) as client:
        for url in ("/demo/source?path=app/jobs/email.py", "/demo/guide/jobs"):
            response = await client.get(url)
            assert response.status_code == 303 and response.headers["location"].startswith("/login")
        await login(client)
        source = await client.get("/demo/source?path=app/jobs/email.py")
        assert source.status_code == 200
        assert 'id="L1"' in source.text and "class EmailJob" in source.text
        assert '<h1 class="mono source-path">app/jobs/email.py</h1>' in source.text
        assert "&lt;" in (await client.get("/demo/source?path=templates/base.html")).text  # escaped
        chapter = await client.get("/demo/guide/jobs")
        assert chapter.status_code == 200 and "<h1>" in chapter.text
        assert 'aria-current="page">Jobs<' in chapter.text
        assert (await client.get("/demo/guide")).headers["location"] == "/demo/guide/index"
        for missing in (
            "/demo/guide/nope",
            "/demo/guide/img/nope.png",
            "/demo/guide/img/..%2Fjobs.md",
        ):
            assert (await client.get(missing)).status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/etc/passwd",
        "../README.md",
        "app/../../etc/passwd",
        "app\\web.py",
        ".git/config",
        ".venv/pyvenv.cfg",
        "var/dev.env",
        "app/does_not_exist.py",
        "app",
        "static/css/../../.git/HEAD",
    ],
)
def test_the_source_view_shows_only_project_text_files(path: str) -> None:
    assert source_file(path) is None


def test_the_source_view_shows_the_files_pages_link() -> None:
    for path in ("app/jobs/email.py", "mega/jobs/consumer.py", "static/js/common.js", "Makefile"):
        found = source_file(path)
        assert found is not None and found.is_file()


def test_every_chapter_listed_exists() -> None:
    names = {name for name, _ in CHAPTERS}
    files = {path.stem for path in GUIDE.glob("*.md")}
    assert names <= files, f"chapters listed but missing: {sorted(names - files)}"
