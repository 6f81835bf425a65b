"""Layout checks measured in the browser: words broken across lines, boxes wider than their
room, scroll boxes that cut a row, cards left alone on a row."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# Every word (a run of non-space characters in one text node) under `selector` whose glyphs
# land on more than one line: the browser broke it mid-word.
BROKEN_WORDS_JS = """(selector) => {
  const broken = [];
  for (const root of document.querySelectorAll(selector)) {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const match of node.nodeValue.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, match.index);
        range.setEnd(node, match.index + match[0].length);
        const lines = new Set([...range.getClientRects()]
          .filter((rect) => rect.width > 0).map((rect) => Math.round(rect.bottom)));
        if (lines.size > 1) broken.push(match[0]);
      }
    }
  }
  return broken;
}"""

# The elements under `selector` whose content is wider than their box, by their text.
OVERFLOWING_JS = """(selector) => [...document.querySelectorAll(selector)]
  .filter((e) => e.scrollWidth > e.clientWidth + 1).map((e) => e.textContent.trim().slice(0, 60))"""

# A scroll box's height against its table: the header, the rows' heights, and whether it scrolls.
SCROLL_ROWS_JS = """(selector) => {
  const box = document.querySelector(selector);
  const table = box.querySelector("table");
  return {
    box: box.clientHeight,
    scrolls: box.scrollHeight > box.clientHeight,
    head: table.tHead.getBoundingClientRect().height,
    rows: [...table.tBodies[0].rows].map((row) => row.getBoundingClientRect().height),
  };
}"""

# How many of the elements under `selector` sit on each visual row, top to bottom.
PER_ROW_JS = """(selector) => {
  const rows = new Map();
  for (const e of document.querySelectorAll(selector)) {
    const top = Math.round(e.getBoundingClientRect().top);
    rows.set(top, (rows.get(top) || 0) + 1);
  }
  return [...rows.entries()].sort((a, b) => a[0] - b[0]).map((entry) => entry[1]);
}"""


def broken_words(page: Any, selector: str) -> list[str]:
    found: list[str] = page.evaluate(BROKEN_WORDS_JS, selector)
    return found


def overflowing(page: Any, selector: str) -> list[str]:
    found: list[str] = page.evaluate(OVERFLOWING_JS, selector)
    return found


def per_row(page: Any, selector: str) -> list[int]:
    found: list[int] = page.evaluate(PER_ROW_JS, selector)
    return found


def whole_rows(page: Any, selector: str) -> int | None:
    """How many whole rows the scroll box at `selector` shows at rest (its height is its
    header plus exactly that many rows, to a pixel), or None when it cuts a row."""
    m = page.evaluate(SCROLL_ROWS_JS, selector)
    height = m["head"]
    for shown, row in enumerate(m["rows"]):
        if abs(height - m["box"]) <= 1:
            return shown
        height += row
    return len(m["rows"]) if abs(height - m["box"]) <= 1 and not m["scrolls"] else None


def eventually(check: Callable[[], Any], timeout_s: float = 10) -> Any:
    """`check()`'s first truthy answer, polled until the deadline (live pages re-render)."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)
    return found
