"""The public API: one table (`mega._EXPORTS`), every name importable and the object it names,
whatever was imported before (a submodule must never shadow a public name)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import mega
import mega.web

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter: import every module of mega/ first (as a long-running host would have),
# then resolve every public name, and report where each one comes from.
PROBE = """
import importlib, json, pkgutil
import mega
for info in pkgutil.walk_packages(mega.__path__, "mega."):
    if info.name != "mega.__main__":
        importlib.import_module(info.name)
report = {}
for name in mega.__all__:
    value = getattr(mega, name)
    report[name] = [type(value).__name__, getattr(value, "__module__", None),
                    value is getattr(importlib.import_module(mega._EXPORTS[name]), name)]
from mega import boot
report["from mega import boot"] = [type(boot).__name__, callable(boot)]
print(json.dumps(report))
"""


def test_every_public_name_is_the_documented_object_after_importing_everything() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    report = json.loads(out.stdout)
    assert report.pop("from mega import boot") == ["function", True]
    for name, (kind, module, same) in report.items():
        assert kind != "module", f"mega.{name} is a module: a submodule shadows it"
        assert same, f"mega.{name} is not {mega._EXPORTS[name]}.{name}"
        if module is not None and kind in ("type", "function", "ABCMeta", "_ProtocolMeta"):
            assert module == mega._EXPORTS[name], f"mega.{name} is defined in {module}"


def test_all_is_the_table() -> None:
    assert mega.__all__ == sorted(mega._EXPORTS)
    assert not set(mega.__all__) & {p.stem for p in (ROOT / "mega").iterdir()}


def test_the_type_checking_imports_repeat_the_table_exactly() -> None:
    tree = ast.parse((ROOT / "mega" / "__init__.py").read_text())
    imported = {
        alias.asname or alias.name: node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mega.")
        for alias in node.names
    }
    assert imported == mega._EXPORTS


def test_mega_web_exports_what_it_lists() -> None:
    for name in mega.web.__all__:
        assert getattr(mega.web, name) is not None
    assert callable(mega.web.create_web_app) and callable(mega.web.ok)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        mega.nothing_here  # noqa: B018
    except AttributeError as exc:
        assert "nothing_here" in str(exc)
    else:
        raise AssertionError("mega.nothing_here resolved")
