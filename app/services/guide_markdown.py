"""A guide chapter (docs/guide/*.md) as HTML for the demo's guide pages.

A chapter is written to read well on GitHub too, so its links are relative to docs/guide/:
`jobs.md#4-streams`, `img/jobs.png`, `../../bench/RESULTS.md`. On the page those would point
under /demo/guide/ and miss; here each becomes the page that shows it: another chapter's page,
the guide's image route, or the source view for any other file of the project. Headings get
GitHub's anchors, so `jobs.md#4-streams` lands on its heading on the page as on GitHub.
CommonMark with raw HTML off: a chapter cannot inject markup.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

if TYPE_CHECKING:
    from markdown_it.token import Token

GUIDE_URL = "/demo/guide"
SOURCE_URL = "/demo/source"


def heading_anchor(text: str, taken: set[str]) -> str:
    """GitHub's anchor for a heading's text: lower case, punctuation dropped, spaces to
    hyphens, and `-1`, `-2` after a repeat; `taken` collects the anchors of one page."""
    anchor = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
    unique, n = anchor, 0
    while unique in taken:
        n += 1
        unique = f"{anchor}-{n}"
    taken.add(unique)
    return unique


def render_chapter(
    text: str,
    *,
    chapter_dir: Path,
    root: Path,
    chapters: Iterable[str],
    shows_source: Callable[[str], bool],
) -> str:
    """The chapter's HTML. `chapter_dir` is the folder its relative links start from, `root` the
    project's, `chapters` the names with a guide page, and `shows_source(path)` whether the
    source view shows that project path; a link it cannot place is left as written."""
    from markdown_it import MarkdownIt  # here, not at import: most web processes never need it

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(text)
    pages, root, chapter_dir = set(chapters), root.resolve(), chapter_dir.resolve()

    def page_for(target: str) -> str | None:
        parts = urlsplit(target)
        if parts.scheme or parts.netloc or not parts.path or parts.path.startswith("/"):
            return None  # another site, an anchor on this page, or a path of the site itself
        fragment = f"#{parts.fragment}" if parts.fragment else ""
        resolved = (chapter_dir / parts.path).resolve()
        if not resolved.is_relative_to(root):
            return None
        relative = PurePosixPath(resolved.relative_to(root).as_posix())
        in_guide = resolved.parent == chapter_dir
        if in_guide and resolved.suffix == ".md" and resolved.stem in pages:
            return f"{GUIDE_URL}/{resolved.stem}{fragment}"
        if resolved.parent == (chapter_dir / "img").resolve():
            return f"{GUIDE_URL}/img/{quote(resolved.name)}"
        if shows_source(str(relative)):
            return f"{SOURCE_URL}?path={quote(str(relative), safe='/')}{fragment}"
        return None

    taken: set[str] = set()
    for index, token in enumerate(tokens):
        if token.type == "heading_open":
            token.attrSet("id", heading_anchor(_plain_text(tokens[index + 1]), taken))
    for token in _inline_children(tokens):
        attr = {"link_open": "href", "image": "src"}.get(token.type)
        target = token.attrGet(attr) if attr else None
        if attr and isinstance(target, str) and (page := page_for(target)) is not None:
            token.attrSet(attr, page)
    html: str = md.renderer.render(tokens, md.options, {})
    # Code blocks and tables scroll sideways on a phone: a keyboard must be able to reach them.
    return html.replace("<pre>", '<pre tabindex="0">').replace("<table>", '<table tabindex="0">')


def _inline_children(tokens: list[Token]) -> Iterator[Token]:
    for token in tokens:
        yield from token.children or ()


def _plain_text(inline: Token) -> str:
    return "".join(c.content for c in inline.children or () if c.type in ("text", "code_inline"))
