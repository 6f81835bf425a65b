"""`mega new NAME`: a project of one's own, written from the templates in templates/new/.

    mega new shop                 # ./shop: jobs and events on NATS JetStream
    mega new shop --bus redis     # ... on Redis Streams
    mega new shop --bus postgres  # ... in the application's PostgreSQL database

The project holds one of each abstraction (a Schedule, a Job with a schema, an Event and its
Listener, a CPU Worker), a web app with one JSON route and one page, its config, and tests on
mega.testing that pass at once, without a server. Templates are plain files whose
`{{placeholder}}` marks are replaced (no template engine: the core install has none); a file's
`.tmpl` suffix keeps the repository's linters and importers off it, and `package/` becomes the
project's package.
"""

from __future__ import annotations

import keyword
import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from mega.errors import ConfigError

TEMPLATES = Path(__file__).with_name("templates") / "new"
TEMPLATE_SUFFIX = ".tmpl"
# Template paths renamed on the way out: the package folder, and a dotfile that package data
# tools would leave behind under its own name.
RENAMED = {"package": "{name}", "gitignore": ".gitignore"}
PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
PACKAGE_NAME = re.compile(r"[a-z][a-z0-9_]*")

BUSES = ("nats", "redis", "postgres")
DEFAULT_BUS = "nats"
# Names a project's package must not take: importing it would find the other one, or the
# project's own folders would collide with it.
RESERVED = {
    "mega": "the framework itself",
    "mega_config": "the project's config module",
    "tests": "the project's tests folder",
    "templates": "the project's templates folder",
    "var": "the folder mega dev keeps its data in",
    **{
        name: "a package the project imports"
        for name in (
            "alembic",
            "fastapi",
            "httpx",
            "jinja2",
            "nats",
            "pydantic",
            "pytest",
            "redis",
            "sqlalchemy",
            "starlette",
            "uvicorn",
        )
    },
}

# What differs with the bus: its entry in mega_config.py, the environment it reads and what it
# says of the database, the words the README uses, and the extras of mega-py the project needs.
BUS_CONFIG = {
    "nats": (
        "# Jobs and events on NATS JetStream (`mega dev` embeds a nats-server).\n"
        'BUS = {"driver": "nats", "url": os.environ.get("NATS_URL", "nats://127.0.0.1:4222")}'
    ),
    "redis": (
        "# Jobs and events on Redis Streams, in the Redis of the cache.\n"
        'BUS = {"driver": "redis", "url": REDIS_URL}'
    ),
    "postgres": (
        "# Jobs and events in the application's database (DATABASE_URL), which must then be\n"
        "# PostgreSQL: `mega dev` starts an embedded one when DATABASE_URL is unset.\n"
        'BUS = {"driver": "postgres"}'
    ),
}
BUS_ENVIRONMENT = {
    "nats": (
        "    NATS_URL         nats://127.0.0.1:4222     the bus of the jobs and events\n"
        "    DATABASE_URL     unset: SQLite in var/mega.db beside this file"
    ),
    "redis": "    DATABASE_URL     unset: SQLite in var/mega.db beside this file",
    "postgres": (
        "    DATABASE_URL     postgresql://user:password@host/db, also the bus of the jobs and\n"
        "                     events (unset under `mega dev`: it starts an embedded PostgreSQL)"
    ),
}
DATABASE_COMMENT = {
    "nats": "# None: SQLite in var/mega.db beside this file.",
    "redis": "# None: SQLite in var/mega.db beside this file.",
    "postgres": "# PostgreSQL, as the bus needs (DATABASE_URL; `mega dev` sets it).",
}
BUS_WORDS = {
    "nats": "on NATS JetStream",
    "redis": "on Redis Streams",
    "postgres": "through PostgreSQL, beside the data",
}
BUS_EXTRAS = {"nats": "web", "redis": "web", "postgres": "web,postgres"}


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a project's package, in a sentence that says what to type instead;
    None when it can."""
    if not PACKAGE_NAME.fullmatch(name):
        return (
            f"{name!r} is not a valid Python package name: use lowercase letters, digits and "
            f"'_', starting with a letter (mega new {_suggestion(name)})"
        )
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return f"{name!r} is a Python keyword, not a package name (mega new {name}_app)"
    taken = RESERVED.get(name) or (
        "a module of Python's standard library" if name in sys.stdlib_module_names else None
    )
    if taken:
        return f"{name!r} is {taken}; a package of that name would hide it (mega new {name}_app)"
    return None


def _suggestion(name: str) -> str:
    words = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "my_project"
    return words if words[0].isalpha() else f"project_{words}"


def new_project(name: str, parent: Path, *, bus: str = DEFAULT_BUS) -> Path:
    """Write the project `name` into `parent / name` (absent or empty) and return its folder.
    ConfigError, before anything is written, for a name or a folder that will not do."""
    problem = name_problem(name)
    if problem:
        raise ConfigError(problem)
    if bus not in BUSES:
        raise ConfigError(f"--bus: one of {', '.join(BUSES)}, got {bus!r}")
    target = parent / name
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(
            f"{name}/ exists here and is not empty: choose another name, or move it away"
        )
    values = {
        "package": name,
        "bus": BUS_CONFIG[bus],
        "bus_environment": BUS_ENVIRONMENT[bus],
        "database_comment": DATABASE_COMMENT[bus],
        "bus_words": BUS_WORDS[bus],
        "mega_requirement": f"mega-py[{BUS_EXTRAS[bus]}]{_series()}",
    }
    for template in sorted(TEMPLATES.rglob(f"*{TEMPLATE_SUFFIX}")):
        relative = template.relative_to(TEMPLATES).with_suffix("")  # drops .tmpl
        parts = [RENAMED.get(part, part).format(name=name) for part in relative.parts]
        path = target.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fill(template.read_text(), values))
    return target


def fill(text: str, values: dict[str, str]) -> str:
    """`text` with each `{{key}}` replaced by values[key]. Jinja's own marks, written with
    spaces (`{{ order.id }}`), are left alone."""
    return PLACEHOLDER.sub(lambda found: values[found.group(1)], text)


def _series() -> str:
    """The version range of mega-py the project asks for: this release's series (`~=0.1.0`).
    Unpinned, pip would take PyPI's `mega-py`, an unrelated project, where this one is not
    installed already."""
    try:
        major, minor, *_ = version("mega-py").split(".")
    except (PackageNotFoundError, ValueError):
        return ""
    return f"~={major}.{minor}.0"
