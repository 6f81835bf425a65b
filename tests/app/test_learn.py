"""The source view and the guide pages the demos link to: login-gated, confined to the
project's own text files, chapters rendered with their links rewritten and raw HTML off."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest

from app.routes.learn import CHAPTERS, GUIDE, source_file
from app.services.guide_markdown import heading_anchor, render_chapter
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
        assert chapter.status_code == 200
        assert '<h1 id="jobs-a-durable-queue-on-nats-jetstream">' in chapter.text  # its anchor
        assert 'aria-current="page">Jobs<' in chapter.text
        assert (await client.get("/demo/guide")).headers["location"] == "/demo/guide/index"
        for _ in range(2):  # a NUL byte is a plain 404, and the next request is served
            assert (await client.get("/demo/source?path=app/web.py%00")).status_code == 404
            assert (await client.get("/demo/source?path=app/web.py")).status_code == 200
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
        "app/web.py\x00",
        "app/\x00web.py",
        "app/web.py\n",
    ],
)
def test_the_source_view_shows_only_project_text_files(path: str) -> None:
    assert source_file(path) is None


def test_the_source_view_shows_the_files_pages_link() -> None:
    for path in ("app/jobs/email.py", "mega/lanes/consumer.py", "static/js/common.js", "Makefile"):
        found = source_file(path)
        assert found is not None and found.is_file()


def test_every_chapter_listed_exists() -> None:
    names = {name for name, _ in CHAPTERS}
    files = {path.stem for path in GUIDE.glob("*.md")}
    assert names <= files, f"chapters listed but missing: {sorted(names - files)}"


class PageLinks(HTMLParser):
    """The links (`href`, `src`) and the element ids of one page, as a browser reads them."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.links.append(value)
            elif name == "id" and value:
                self.ids.add(value)


def page_links(html: str) -> PageLinks:
    parser = PageLinks()
    parser.feed(html)
    return parser


async def test_every_link_of_every_chapter_page_opens(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    """Each chapter as the page renders it: every link on the site (chapters, images, files of
    the project, the pages' own chrome) answers 200, and a link's #anchor is an id there."""
    config = sample_config_for(tmp_path, nats_url, redis_url)
    broken: list[str] = []
    async with web_client(config, pools=True) as client:  # the worker page shows its pool
        await login(client)
        pages: dict[str, PageLinks] = {}

        async def opened(url: str) -> PageLinks | None:
            if url not in pages:
                response = await client.get(url)
                if response.status_code != 200:
                    return None
                pages[url] = page_links(response.text)
            return pages[url]

        for name, _ in CHAPTERS:
            page_url = f"/demo/guide/{name}"
            chapter = await opened(page_url)
            assert chapter is not None, page_url
            for link in chapter.links:
                target = urlsplit(urljoin(f"http://testserver{page_url}", link))
                if target.scheme not in ("http", "https") or target.netloc != "testserver":
                    continue  # another site (or a data: icon): not this app's to answer
                url = target.path + (f"?{target.query}" if target.query else "")
                found = await opened(url)
                if found is None:
                    broken.append(f"{name}: {link} -> {url} does not answer 200")
                elif target.fragment and target.fragment not in found.ids:
                    broken.append(f"{name}: {link} -> {url} has no #{target.fragment}")
    assert not broken, "\n".join(broken)


def test_a_chapter_links_to_the_pages_that_show_its_targets(tmp_path: Path) -> None:
    """Relative links, as a chapter writes them for GitHub, on the page: a chapter, its heading,
    an image, a project file in the source view; another site and an unknown file stay."""
    root = tmp_path
    (root / "docs" / "guide" / "img").mkdir(parents=True)
    (root / "bench").mkdir()
    text = (
        "# Jobs, `mega dlq` and more\n\n## Pitfalls\n\n## Pitfalls\n\n"
        "[a](schedules.md#2-ticks) [b](../../bench/RESULTS.md) ![c](img/jobs.png) "
        "[d](https://example.com/x.md) [e](#pitfalls-1) [f](../../secret.txt) [g](notes.md)\n"
    )
    html = render_chapter(
        text,
        chapter_dir=root / "docs" / "guide",
        root=root,
        chapters=["schedules"],
        shows_source=lambda path: path in ("bench/RESULTS.md", "docs/guide/notes.md"),
    )
    links = page_links(html)
    assert links.links == [
        "/demo/guide/schedules#2-ticks",
        "/demo/source?path=bench/RESULTS.md",
        "/demo/guide/img/jobs.png",
        "https://example.com/x.md",
        "#pitfalls-1",
        "../../secret.txt",
        "/demo/source?path=docs/guide/notes.md",
    ]
    assert links.ids == {"jobs-mega-dlq-and-more", "pitfalls", "pitfalls-1"}
    assert heading_anchor("Limits that differ: `--apply-limits`", set()) == (
        "limits-that-differ---apply-limits"
    )
