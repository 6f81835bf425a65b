"""`mega new NAME`: a project whose config passes `mega check` on every bus, written as ruff
would format it, and the one-line refusals of a name or a folder that will not do. The
project's own tests, run in a fresh virtualenv, and `mega dev` serving it are
tests/ops/test_mega_new.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mega.runtime.cli import main
from mega.runtime.scaffold import BUSES, TEMPLATES, name_problem

BIN = Path(sys.executable).parent


def mega_new(where: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run `mega new ...` in `where`, in this process; its exit code and its stderr."""
    cwd = Path.cwd()
    os.chdir(where)
    try:
        with pytest.raises(SystemExit) as exited:
            main(["new", *args])
    finally:
        os.chdir(cwd)
    return int(exited.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("bus", BUSES)
def test_a_new_project_passes_mega_check_on_each_bus(
    tmp_path: Path, bus: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert mega_new(tmp_path, "shop", "--bus", bus, capsys=capsys) == (0, "")
    project = tmp_path / "shop"
    written = {path.relative_to(project).as_posix() for path in project.rglob("*")}
    assert {"mega_config.py", "Makefile", "README.md", "pyproject.toml", ".gitignore"} <= written
    assert {"shop/jobs.py", "shop/web.py", "templates/orders.html", "tests/test_web.py"} <= written
    for path in project.rglob("*.*"):
        assert "{{package" not in path.read_text(), path  # every placeholder filled
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "MEGA_CONFIG")}
    checked = subprocess.run(
        [sys.executable, "-m", "mega", "check"],
        capture_output=True,
        text=True,
        cwd=project,
        env=env,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.splitlines()[-1] == (
        "mega check: 1 schedule, 1 job, 1 worker, 1 event, 1 listener ok"
    )
    extras = "web,postgres" if bus == "postgres" else "web"
    assert f'"mega-py[{extras}]' in (project / "pyproject.toml").read_text()


def test_the_project_is_written_as_ruff_formats_and_lints_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert mega_new(tmp_path, "shop", capsys=capsys)[0] == 0
    # The project's own settings (pyproject.toml), with the repository's rules on top.
    rules = ["--select", "E,F,W,I,B,UP,SIM,RUF", "--ignore", "RUF012"]
    for command in (["check", *rules], ["format", "--check"]):
        ran = subprocess.run(
            [str(BIN / "ruff"), *command, "."],
            capture_output=True,
            text=True,
            cwd=tmp_path / "shop",
            timeout=60,
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr


def test_mega_new_needs_no_config_and_imports_no_web_stack(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from mega.runtime.cli import main\n"
        "try:\n"
        "    main(['new', 'shop'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "heavy = ('fastapi', 'starlette', 'jinja2', 'uvicorn', 'sqlalchemy', 'nats', 'redis')\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in heavy))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MEGA_CONFIG"}
    ran = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1] == "[]"
    assert not (tmp_path / "mega_config.py").exists() and (tmp_path / "shop").is_dir()


def test_an_empty_folder_of_that_name_is_filled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "shop").mkdir()
    assert mega_new(tmp_path, "shop", capsys=capsys)[0] == 0
    assert (tmp_path / "shop" / "shop" / "__init__.py").is_file()


def test_a_folder_that_is_not_empty_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "notes.txt").write_text("mine")
    code, err = mega_new(tmp_path, "shop", capsys=capsys)
    assert (code, err) == (
        2,
        "mega new: error: shop/ exists here and is not empty: choose another name, or move "
        "it away\n",
    )
    assert [path.name for path in (tmp_path / "shop").iterdir()] == ["notes.txt"]


@pytest.mark.parametrize(
    ("name", "says"),
    [
        (
            "My-Shop",
            "is not a valid Python package name: use lowercase letters, digits and '_', "
            "starting with a letter (mega new my_shop)",
        ),
        ("2shop", "is not a valid Python package name"),
        ("shop/web", "(mega new shop_web)"),
        ("class", "is a Python keyword, not a package name (mega new class_app)"),
        (
            "json",
            "is a module of Python's standard library; a package of that name would "
            "hide it (mega new json_app)",
        ),
        ("mega", "is the framework itself"),
        ("tests", "is the project's tests folder"),
        ("fastapi", "is a package the project imports"),
    ],
)
def test_a_name_that_is_no_package_name_is_refused_saying_what_to_type(
    tmp_path: Path, name: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = mega_new(tmp_path, name, capsys=capsys)
    assert code == 2
    assert err.startswith(f"mega new: error: {name!r} ") and says in err
    assert err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["shop", "my_shop", "shop2", "a"])
def test_lowercase_identifiers_are_package_names(name: str) -> None:
    assert name_problem(name) is None


def test_every_template_ships_with_the_package() -> None:
    """pyproject.toml's package data names each folder of the templates: a non-editable
    install has them all."""
    text = (Path(__file__).resolve().parents[3] / "pyproject.toml").read_text()
    folders = {path.parent.relative_to(TEMPLATES) for path in TEMPLATES.rglob("*.tmpl")}
    for folder in folders:
        depth = len(folder.parts)
        assert f'"runtime/templates/new/{"*/" * depth}*.tmpl"' in text, folder
