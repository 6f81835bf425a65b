"""The config reference: every key of a config file, written from the models of mega.config
(their types, defaults and `Field` descriptions), one Markdown section per model.

    python -m mega.runtime.config_reference [PATH]   # PATH: docs/guide/config.md by default

A key is documented where it is declared, so the page cannot drift from the code: the docs test
regenerates it and compares.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from mega.config import ConfigFile
from mega.settings import Shown

DEFAULT_PATH = Path("docs/guide/config.md")
ALIAS = "<alias>"

INTRO = """\
# Config reference

A config file (`mega_config.py`, or the file `--config` or `MEGA_CONFIG` names) is plain Python:
each key of the first table below is a module-level name, and a key whose type is a section
holds a dict of that section's keys. Every mistake is reported at boot in one error whose lines
name the key (`services.buses.jobs.url: ...`).

```python
services = {
    "caches": {"main": {"driver": "redis", "url": "redis://127.0.0.1:6379/0"}},
    "locks": {"default": {"driver": "redlock", "caches": ["main"]}},
    "buses": {"jobs": {"driver": "nats", "url": "nats://127.0.0.1:4222"}},
}
jobs = [SendWelcomeEmail]
metrics = {"enabled": True}
```

This page is written from the models in `mega/config.py` by
`python -m mega.runtime.config_reference`; a key's description is its `Field(description=...)`
there. Edit those and run the command again, never this page.
"""

ENV_INTRO = """\
## Environment variables

A variable set (and not empty) wins over the key it names. `<ALIAS>` is the alias in upper
case: `REDIS_MAIN_URL` for the cache `main`, `NATS_JOBS_URL` for the bus `jobs`, whatever its
driver. Besides these, `MEGA_CONFIG` names the config file and `MEGA_ENV=dev` loads it as
`mega dev` does (a fixed secret key allowed).
"""


@dataclass(frozen=True)
class Section:
    """One model's keys, under the path a config reaches them by (`services.caches.<alias>`)."""

    key: str
    model: type[BaseModel]
    about: str


def sections(root: type[BaseModel] = ConfigFile) -> list[Section]:
    """The root's section, then its sub-models' breadth first: a reader meets the top-level
    names before the tables nested in them."""
    found = [Section("", root, "The module-level names of a config file.")]
    for section in found:  # reaches the sections it appends too
        for name, field in section.model.model_fields.items():
            nested = _nested(field.annotation)
            if nested is not None:
                model, by_alias = nested
                key = _join(section.key, name) + (f".{ALIAS}" if by_alias else "")
                found.append(Section(key, model, field.description or ""))
    return found


def render(root: type[BaseModel] = ConfigFile) -> str:
    parts = [INTRO]
    overrides: list[tuple[str, str]] = []
    for section in sections(root):
        title = f"`{section.key}`" if section.key else "Top-level names"
        rows = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
        for name, field in section.model.model_fields.items():
            env = _shown(field.metadata).env
            about = field.description or ""
            if env:
                about += f" `{env}` overrides it."
                overrides.append((env, _join(section.key, name)))
            cells = [
                f"`{name}`",
                _type_cell(field, _join(section.key, name)),
                _default(field),
                about,
            ]
            rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        parts.append(f"## {title}\n\n{section.about}\n\n" + "\n".join(rows) + "\n")
    table = ["| variable | key |", "| --- | --- |"]
    table += [f"| `{env}` | `{key}` |" for env, key in overrides]
    parts.append(ENV_INTRO + "\n" + "\n".join(table) + "\n")
    return "\n".join(parts)


def type_name(annotation: Any, metadata: Sequence[Any] = ()) -> str:
    """A type as a reader says it: `int >= 1`, `non-empty list of str`, `"redis"`."""
    shown = _shown(metadata).type
    if shown:
        return shown
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return type_name(args[0], [*args[1:], *metadata])
    if origin in (Union, types.UnionType):
        named = [type_name(arg) for arg in args if arg is not types.NoneType]
        return " or ".join(named) + (" or None" if types.NoneType in args else "")
    if origin is Literal:
        return " or ".join(json.dumps(arg) for arg in args)
    limits = _constraints(metadata)
    if origin is list:
        sized = "non-empty list" if limits.get("min_length") else "list"
        return f"{sized} of {type_name(args[0])}"
    if origin is dict:
        return f"dict of {type_name(args[0])} -> {type_name(args[1])}"
    if annotation is int:
        low = limits.get("ge", limits["gt"] + 1 if "gt" in limits else None)
        high = limits.get("le", limits["lt"] - 1 if "lt" in limits else None)
        if low is not None and high is not None:
            return f"int from {low} to {high}"
        return f"int >= {low}" if low is not None else "int"
    if annotation is float:
        bound = next((f" {sign} {limits[k]}" for k, sign in BOUNDS if k in limits), "")
        return f"float{bound}"
    if annotation is str and "min_length" in limits:
        most = limits.get("max_length")
        return f"str of {limits['min_length']}{f'-{most}' if most else '+'} characters"
    return getattr(annotation, "__name__", str(annotation))


BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
LIMITS = ("gt", "ge", "lt", "le", "min_length", "max_length")


def _constraints(metadata: Sequence[Any]) -> dict[str, Any]:
    items = [inner for item in metadata for inner in _flat(item)]
    return {name: getattr(item, name) for item in items for name in LIMITS if hasattr(item, name)}


def _flat(item: Any) -> list[Any]:
    return list(item.metadata) if isinstance(item, FieldInfo) else [item]


def _shown(metadata: Sequence[Any]) -> Shown:
    return next((item for item in metadata if isinstance(item, Shown)), Shown())


def _nested(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """The model a key holds, and whether it holds one per alias (a dict of them)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if get_origin(annotation) is dict:
        value = get_args(annotation)[1]
        if isinstance(value, type) and issubclass(value, BaseModel):
            return value, True
    return None


def _type_cell(field: FieldInfo, key: str) -> str:
    nested = _nested(field.annotation)
    if nested is None:
        return type_name(field.annotation, field.metadata)
    return f"alias -> see `{key}.{ALIAS}`" if nested[1] else f"see `{key}`"


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "its keys' defaults"
    text = json.dumps(value) if isinstance(value, str) else repr(value)
    return f"`{text}`"


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    path = Path(args[0]) if args else DEFAULT_PATH
    path.write_text(render())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
