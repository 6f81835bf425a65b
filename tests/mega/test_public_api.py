"""The public API: one table (`mega._EXPORTS`), every name importable and the object it names,
whatever was imported before (a submodule must never shadow a public name)."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import mega
import mega.runtime
import mega.web

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter: import every module of mega/ first (as a long-running host would have),
# then resolve every public name, and report where each one comes from.
PROBE = """
import importlib, json, pkgutil
import pytest

import mega
for info in pkgutil.walk_packages(mega.__path__, "mega."):
    if info.name != "mega.__main__":
        importlib.import_module(info.name)
report = {}
for name in mega.__all__:
    value = getattr(mega, name)
    report[name] = [type(value).__name__, getattr(value, "__module__", None),
                    value is getattr(importlib.import_module(mega._EXPORTS[name]), name)]
import mega.runtime
for name in mega.runtime.__all__:
    value = getattr(mega.runtime, name)
    report["runtime." + name] = [type(value).__name__, getattr(value, "__module__", None),
                    value is getattr(importlib.import_module(mega.runtime._EXPORTS[name]), name)]
from mega.runtime import boot
report["from mega.runtime import boot"] = [type(boot).__name__, callable(boot)]
print(json.dumps(report))
"""


def test_every_public_name_is_the_documented_object_after_importing_everything() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    report = json.loads(out.stdout)
    assert report.pop("from mega.runtime import boot") == ["function", True]
    assert len(report) == len(mega.__all__) + len(mega.runtime.__all__)
    for key, (kind, module, same) in report.items():
        package, name = ("mega.runtime", key[8:]) if key.startswith("runtime.") else ("mega", key)
        table = mega.runtime._EXPORTS if package == "mega.runtime" else mega._EXPORTS
        assert kind != "module", f"{package}.{name} is a module: a submodule shadows it"
        assert same, f"{package}.{name} is not {table[name]}.{name}"
        if module is not None and kind in ("type", "function", "ABCMeta", "_ProtocolMeta"):
            assert module == table[name], f"{package}.{name} is defined in {module}"


def test_all_is_the_table_of_at_most_forty_names() -> None:
    assert mega.__all__ == sorted(mega._EXPORTS)
    assert len(mega.__all__) <= 40
    assert mega.runtime.__all__ == sorted(mega.runtime._EXPORTS)
    assert not set(mega._EXPORTS) & {*mega._MOVED, *mega._REPLACED}


def test_a_moved_name_still_resolves_warning_once_where_it_lives_now() -> None:
    probe = """
import importlib, json, warnings
import pytest

import mega
report = {}
for name, (home, _) in mega._MOVED.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = getattr(mega, name)
        again = getattr(mega, name)
    new = getattr(importlib.import_module(home), name)
    report[name] = [old is new and again is new, [str(w.message) for w in caught]]
print(json.dumps(report))
"""
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    report = json.loads(out.stdout)
    assert set(report) == set(mega._MOVED)
    for name, (same, messages) in report.items():
        home = mega._MOVED[name][0]
        assert same, f"mega.{name} is not {home}.{name}"
        assert messages == [
            f"mega.{name} is deprecated and goes in mega 0.3: use from {home} import {name}"
        ]
    assert not set(mega.__all__) & {p.stem for p in (ROOT / "mega").iterdir()}


def test_the_type_checking_imports_repeat_the_table_exactly() -> None:
    tree = ast.parse((ROOT / "mega" / "__init__.py").read_text())
    [block] = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    ]
    imported = {
        alias.asname or alias.name: node.module
        for node in ast.walk(block)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mega.")
        for alias in node.names
    }
    assert imported == mega._EXPORTS


def test_a_replaced_name_gives_what_replaces_it_and_warns_once() -> None:
    for old, (module, defined_as, instead) in mega._REPLACED.items():
        new = getattr(importlib.import_module(module), defined_as)
        with pytest.warns(DeprecationWarning, match=f"mega.{old} is deprecated .*: use "):
            assert getattr(mega, old) is new
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert getattr(mega, old) is new  # once: no second warning
        assert instead in (f"mega.{defined_as}", "await YourEvent.emit(ctx, payload)")
    assert mega._REPLACED["JobWorker"][1] == "JobRunner"


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


PACKAGES = ("mega", "mega.web", "mega.runtime", "mega.drivers")


def public_functions() -> list[tuple[str, Callable[..., Any]]]:
    """Every function and method a user reaches through the public packages' names (and
    mega.testing's), with parameters, written in mega/ (not a dataclass's or typing's own)."""
    import inspect

    import mega.testing

    objects = [
        (f"{p}.{n}", getattr(importlib.import_module(p), n))
        for p in PACKAGES
        for n in importlib.import_module(p).__all__
    ]
    objects += [
        (f"mega.testing.{name}", value)
        for name, value in vars(mega.testing).items()
        if not name.startswith("_") and getattr(value, "__module__", "") == "mega.testing"
    ]
    found: list[tuple[str, Callable[..., Any]]] = []
    for qual, obj in objects:
        members = [(qual, obj)]
        if inspect.isclass(obj):
            members = []
            seen: set[str] = set()
            package = obj.__module__.rpartition(".")[0]
            for cls in inspect.getmro(obj):  # and what it inherits from its own package
                if cls is not obj and (
                    not cls.__module__.startswith(package + ".")
                    or getattr(cls, "_is_protocol", False)
                ):
                    continue
                for attr, value in vars(cls).items():
                    if attr in seen or (attr.startswith("_") and attr != "__init__"):
                        continue
                    seen.add(attr)
                    function = getattr(value, "__func__", value)
                    members.append((f"{qual}.{attr}", function))
        for name, function in members:
            if not inspect.isfunction(function):
                continue
            written_in = Path(function.__code__.co_filename)
            if not written_in.is_file() or ROOT / "mega" not in written_in.parents:
                continue  # made by @dataclass, or typing's own
            parameters = inspect.signature(function).parameters
            if any(p not in ("self", "cls") for p in parameters):
                found.append((name, function))
    return found


def interface_methods() -> list[tuple[str, Callable[..., Any]]]:
    """The methods, with parameters, of the Protocols mega/drivers/base.py gives (what a driver
    implements, Receiver from mega/drivers/receiving.py among them) and the public ones of
    LaneEndpoint (what JobQueue and EventBus inherit):
    public_functions() leaves both out, a Protocol and a class of another package."""
    import inspect

    import mega.drivers.base
    from mega.lanes.endpoint import LaneEndpoint

    protocols = [
        value
        for value in vars(mega.drivers.base).values()
        if inspect.isclass(value)
        and value.__module__ in ("mega.drivers.base", "mega.drivers.receiving")
        and getattr(value, "_is_protocol", False)
    ]
    found: list[tuple[str, Callable[..., Any]]] = []
    for cls in [*protocols, LaneEndpoint]:
        for attr, value in vars(cls).items():
            function = getattr(value, "__func__", value)  # a classmethod's function
            if attr.startswith("_") or not inspect.isfunction(function):
                continue
            if any(p not in ("self", "cls") for p in inspect.signature(function).parameters):
                found.append((f"{cls.__module__}.{cls.__name__}.{attr}", function))
    return found


def test_every_public_function_lists_its_arguments() -> None:
    import inspect

    functions = public_functions()
    assert len(functions) > 140  # the walk found them (148 today)
    interfaces = interface_methods()
    assert len(interfaces) > 30  # the Protocols' and LaneEndpoint's (32 today)
    undocumented = []
    for name, function in functions + interfaces:
        doc = inspect.getdoc(function) or ""
        named = [p for p in inspect.signature(function).parameters if p not in ("self", "cls")]
        args = doc.partition("Args:")[2]
        missing = [
            p
            for p in named
            if not any(line.strip().lstrip("*").startswith(f"{p}:") for line in args.splitlines())
        ]
        if not args or missing:
            undocumented.append(f"{name}: {', '.join(missing) or 'no Args section'}")
    assert not undocumented, "\n".join(undocumented)
