"""The config reference (docs/guide/config.md) is written from mega.config's models: every key
has a description, and the committed page is exactly what the models write today."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import Field, StrictInt

from mega.runtime.config_reference import render, sections, type_name
from mega.settings import Shown

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "config.md"
REGENERATE = ".venv/bin/python -m mega.runtime.config_reference"


def test_every_key_of_every_section_has_a_description() -> None:
    missing = [
        f"{section.key or 'top level'}: {name}"
        for section in sections()
        for name, field in section.model.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert not missing, f"keys without Field(description=...) in mega/config.py: {missing}"


def test_the_committed_page_is_what_the_models_write() -> None:
    assert PAGE.read_text() == render(), (
        f"{PAGE.name} differs from mega/config.py's models: run `{REGENERATE}` and commit it"
    )


def test_the_sections_come_top_level_first_then_services_tables() -> None:
    keys = [section.key for section in sections()]
    assert keys == [
        "",
        "services",
        "auth",
        "metrics",
        "outbox",
        "work",
        "services.caches.<alias>",
        "services.locks.<alias>",
        "services.buses.<alias>",
        "services.database",
    ]


@pytest.mark.parametrize(
    ("annotation", "shown"),
    [
        (Annotated[StrictInt, Field(gt=0)], "int >= 1"),
        (Annotated[int, Field(gt=0, lt=65536)], "int from 1 to 65535"),
        (Annotated[float, Field(ge=0)], "float >= 0"),
        (Annotated[str, Field(min_length=16)] | None, "str of 16+ characters or None"),
        (Annotated[list[str], Field(min_length=1)], "non-empty list of str"),
        (Literal["redis"], '"redis"'),
        (str | list[str], "str or list of str"),
        (dict[str, bool], "dict of str -> bool"),
        (Annotated[list[type], Shown(type="list of Job classes")], "list of Job classes"),
    ],
)
def test_a_type_reads_as_a_reader_says_it(annotation: Any, shown: str) -> None:
    assert type_name(annotation) == shown
