"""Every shell command in the guide (docs/guide/*.md) is run or checked here, so it cannot rot.

The convention, for whoever writes a chapter:

- Every terminal step works pasted into a fresh shell in the repository root: a block starts
  with ``. .venv/bin/activate`` (the venv ``make install`` made) or calls ``.venv/bin/mega``,
  ``.venv/bin/python``, ``.venv/bin/pytest``. Any program the venv installs (honcho and
  supervisord too) is reached that way; ``make`` targets find the venv themselves.
- A fenced block with the info string ``sh runnable`` is run: ``bash -euo pipefail`` in the
  repository root as a user's shell has it, no venv on PATH and no VIRTUAL_ENV, with a
  timeout, and must exit 0. Each chapter gets fresh embedded servers (nats-server with
  JetStream, a Redis-compatible server) and a fresh SQLite file: NATS_URL, REDIS_URL,
  DATABASE_URL and MEGA_SECRET_KEY are set, the hosts' metrics ports are free ones, and PORT is
  a free port for a block that starts a web app (write ``--port "${PORT:-8477}"``). Blocks of
  one chapter run in document order and may build on each other. A block that starts a server
  must stop it itself (``trap ... EXIT``) or bound it (``timeout --preserve-status 5 mega
  worker`` exits 0 after a graceful drain). Use ``grep`` to make a block assert what the text
  promises.
- A plain ``sh`` block is for what cannot run here: long-running servers (``make run``,
  ``mega dev``), containers (``docker compose``), supervisors. Its commands are checked
  instead: a ``make`` target must exist in the Makefile, ``mega <command>`` in ``mega --help``,
  a ``docker compose --profile`` in docker-compose.yml, a file named in it must exist, and any
  other program must be one of KNOWN_PROGRAMS. The README's ``sh`` blocks are checked the same.
- Every image a chapter shows (``![alt](img/name.png)``) must exist (``make screenshots`` takes
  them from the browser tests), every link to another chapter must reach a heading there, and
  every file (```mega/jobs/queue.py```) and test (```test_same_id_runs_once```) a chapter names
  in backticks must exist.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

from mega.drivers.embedded import EmbeddedServer, free_port
from mega.drivers.nats.embedded import EmbeddedNats
from mega.drivers.redis.embedded import EmbeddedRedis
from tests.factories import TEST_SECRET
from tests.processes import unmeasured_env

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide"
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
# The venv a reader's terminal steps use: the checkout's own, as `make install` makes it.
VENV_BIN = ROOT / ".venv" / "bin"
ACTIVATE = (".", ".venv/bin/activate")
# Programs a shell has only through the venv, whatever else it installs: a block calls them as
# `.venv/bin/<name>` or after `. .venv/bin/activate`.
VENV_PROGRAMS = {"mega", "python", "python3", "pytest", "pip", "honcho", "supervisord"}
# A hang's bound, not a speed target: a block of several `mega` commands and a worker's start
# takes 10-20 s on a quiet 2-core machine and twice that while the rest of the suite runs.
BLOCK_TIMEOUT_S = 90
# The chapters of the course; each must teach at least one command a test runs.
COURSE = ("schedules", "jobs", "events", "workers", "testing", "scaling", "operating")
# Programs a plain `sh` block may name besides make, mega and docker compose.
KNOWN_PROGRAMS = {
    ".",
    "source",
    "export",
    "honcho",
    "supervisord",
    "curl",
    "kill",
    "python",
    "pytest",
    "nats",
    "openssl",
    "uvicorn",
}
FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<info>[^`]*)$")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
CHAPTER_LINK = re.compile(r"\]\(([a-z]+\.md)(?:#([^)]*))?\)")


@dataclass(frozen=True)
class Block:
    chapter: str
    line: int
    info: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.chapter}.md:{self.line}"


def chapters() -> list[Path]:
    return sorted(GUIDE.glob("*.md"))


def fenced_blocks(path: Path) -> Iterator[Block]:
    """Fenced blocks of a Markdown file, their indentation (a block in a list item) removed."""
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, start = len(opening["indent"]), index
        body: list[str] = []
        index += 1
        while index < len(lines) and lines[index].strip() != "```":
            body.append(lines[index][indent:] if lines[index][:indent].isspace() else lines[index])
            index += 1
        yield Block(path.stem, start + 1, opening["info"].strip(), "\n".join(body) + "\n")
        index += 1


def shell_blocks(kind: str, paths: list[Path]) -> list[Block]:
    wanted = {"runnable": "sh runnable", "plain": "sh"}[kind]
    return [b for path in paths for b in fenced_blocks(path) if b.info == wanted]


RUNNABLE = shell_blocks("runnable", chapters())
PLAIN = shell_blocks("plain", [*chapters(), README])


def without_venv(environ: dict[str, str]) -> dict[str, str]:
    """`environ` as a fresh shell has it: no VIRTUAL_ENV, and no venv's bin directory (one
    with a pyvenv.cfg beside it, this test's own included) on PATH."""
    env = {k: v for k, v in environ.items() if k != "VIRTUAL_ENV"}
    entries = env.get("PATH", "").split(os.pathsep)
    kept = [e for e in entries if e and not (Path(e).parent / "pyvenv.cfg").is_file()]
    env["PATH"] = os.pathsep.join(e for e in kept if Path(e) not in (BIN, VENV_BIN))
    return env


class ChapterServers:
    """Fresh servers and database per chapter, started when its first block runs."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.envs: dict[str, dict[str, str]] = {}
        self.servers: list[EmbeddedServer] = []

    def env(self, chapter: str) -> dict[str, str]:
        if chapter not in self.envs:
            data = self.tmp / chapter
            nats = EmbeddedNats(data_dir=data / "nats").start()
            self.servers.append(nats)
            redis = EmbeddedRedis(data_dir=data / "redis").start()
            self.servers.append(redis)
            # Unmeasured (unmeasured_env): what a block's commands run is measured where it is
            # tested, and coverage's tracing of every `mega` a block starts was a third of
            # their CPU, the largest share of any test module's.
            shell = without_venv(unmeasured_env())
            env = {k: v for k, v in shell.items() if not k.startswith("MEGA_")}
            env.update(
                NATS_URL=nats.url,
                REDIS_URL=redis.url,
                DATABASE_URL=f"sqlite:///{data / 'guide.db'}",
                MEGA_SECRET_KEY=TEST_SECRET,
                MEGA_METRICS_BIND="127.0.0.1",
                MEGA_SCHEDULER_METRICS_PORT=str(free_port()),
                MEGA_WORKER_METRICS_PORT=str(free_port()),
                PORT=str(free_port()),
            )
            self.envs[chapter] = env
        return self.envs[chapter]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChapterServers]:
    started = ChapterServers(tmp_path_factory.mktemp("guide"))
    try:
        yield started
    finally:
        started.stop()


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_runnable_block_exits_0(block: Block, servers: ChapterServers) -> None:
    assert (VENV_BIN / "mega").is_file(), "the guide's steps use the checkout's venv: make install"
    # Checked as well as run: a python elsewhere on PATH (pyenv's, say) may happen to run it here.
    assert not outside_the_venv(block.text), f"{block.id}:\n{block.text}"
    # In a session of its own: a block over its time is killed with everything it started
    # (its trap does not run then, and a `mega worker` left behind would take the jobs of the
    # chapter's next block).
    shell = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", block.text],
        cwd=ROOT,
        env=servers.env(block.chapter),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        stdout, stderr = shell.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGKILL)
        stdout, _ = shell.communicate()
        pytest.fail(f"{block.id} ran over {BLOCK_TIMEOUT_S} s:\n{block.text}\n{stdout!r}")
    assert shell.returncode == 0, (
        f"{block.id} exited {shell.returncode}:\n{block.text}\n"
        f"--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-3000:]}"
    )


def test_every_chapter_of_the_course_runs_commands() -> None:
    assert {b.chapter for b in RUNNABLE} >= set(COURSE)
    assert sum(len(b.text.splitlines()) for b in RUNNABLE) >= 40


def mega_commands() -> set[str]:
    shown = subprocess.run(
        [str(BIN / "mega"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    return set(re.findall(r"^    (\w+)", shown, re.MULTILINE))


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))


def compose_profiles() -> set[str]:
    compose = (ROOT / "docker-compose.yml").read_text()
    return {
        p
        for found in re.findall(r"profiles: \[([^\]]*)\]", compose)
        for p in re.findall(r'"([\w-]+)"', found)
    }


def commands(text: str) -> Iterator[list[str]]:
    """Each simple command of a shell text, as words, without leading VAR=value assignments."""
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        command: list[str] = []
        for word in [*words, "&&"]:
            if word in ("&&", "||", ";", "|", "&"):
                while command and re.match(r"^\w+=", command[0]):
                    command.pop(0)
                if command:
                    yield command
                command = []
            else:
                command.append(word)


def problems_of(command: list[str], known: dict[str, set[str]]) -> list[str]:
    program, args = command[0], command[1:]
    name = Path(program).name or program  # `.` (source) has no name of its own
    found: list[str] = []
    if name == "make":
        found += [f"no make target {t!r}" for t in args if "=" not in t and t not in known["make"]]
    elif name == "mega":
        if not args or args[0] not in known["mega"]:
            found.append(f"`mega {args[0] if args else ''}` is not in `mega --help`")
    elif name == "docker":
        if args[:1] != ["compose"]:
            found.append("docker: only `docker compose` is known")
        for flag, value in pairwise(args):
            if flag == "--profile" and value not in known["profiles"]:
                found.append(f"docker-compose.yml has no profile {value!r}")
    elif name not in KNOWN_PROGRAMS:
        found.append(f"unknown program {program!r} (add it to KNOWN_PROGRAMS or run the block)")
    for flag, value in pairwise(args):
        if flag == "-m" and name == "python":
            module = ROOT / value.replace(".", "/")
            if not (module.with_suffix(".py").exists() or (module / "__main__.py").exists()):
                found.append(f"no module {value}")
    for arg in args:
        looks_like_a_file = "/" in arg and not re.match(r"^\w+://|^\$|^-", arg)
        if looks_like_a_file and not (ROOT / arg).exists():
            found.append(f"no file {arg}")
    return found


def outside_the_venv(text: str) -> list[str]:
    """The commands of a block a fresh shell would not find: a venv program called by its bare
    name in a block that does not start with `. .venv/bin/activate`."""
    found = list(commands(text))
    if found and found[0] in ([*ACTIVATE], ["source", ACTIVATE[1]]):
        return []
    bare = dict.fromkeys(command[0] for command in found if command[0] in VENV_PROGRAMS)
    return [
        f"`{name}` is the venv's: call .venv/bin/{name} or start the block with "
        "`. .venv/bin/activate`"
        for name in bare
    ]


@pytest.mark.parametrize("block", PLAIN, ids=[b.id for b in PLAIN])
def test_plain_block_names_only_commands_that_exist(block: Block) -> None:
    known = {"make": make_targets(), "mega": mega_commands(), "profiles": compose_profiles()}
    problems = [p for command in commands(block.text) for p in problems_of(command, known)]
    problems += outside_the_venv(block.text)
    assert not problems, f"{block.id}:\n{block.text}\n" + "\n".join(problems)


def test_a_fresh_shell_has_no_venv(tmp_path: Path) -> None:
    """What the runnable blocks run in: this test's venv and any other are off PATH."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "tools" / "bin").mkdir(parents=True)
    path = [BIN, VENV_BIN, tmp_path / "venv" / "bin", tmp_path / "tools" / "bin", Path("/bin")]
    environ = {"PATH": os.pathsep.join(map(str, path)), "VIRTUAL_ENV": str(BIN.parent), "X": "1"}
    fresh = {"PATH": os.pathsep.join([str(tmp_path / "tools" / "bin"), "/bin"]), "X": "1"}
    assert without_venv(environ) == fresh


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE)
    return {slug(h) for h in headings}


@pytest.mark.parametrize("path", chapters(), ids=[p.name for p in chapters()])
def test_images_and_chapter_links_resolve(path: Path) -> None:
    text = path.read_text()
    missing = [src for src in IMAGE.findall(text) if not (GUIDE / src).is_file()]
    assert not missing, f"{path.name} shows images that do not exist: {missing}"
    broken = [
        f"{target}#{anchor}"
        for target, anchor in CHAPTER_LINK.findall(text)
        if not (GUIDE / target).is_file() or (anchor and anchor not in anchors(GUIDE / target))
    ]
    assert not broken, f"{path.name} links to chapters or headings that do not exist: {broken}"


NAMED_FILE = re.compile(r"`((?:mega|app|tests|static|templates|bench|ecosystem|docs)/[\w./-]+)`")
NAMED_TEST = re.compile(r"`(test_\w+)`")


@pytest.mark.parametrize("path", chapters(), ids=[p.name for p in chapters()])
def test_the_files_and_tests_a_chapter_names_exist(path: Path) -> None:
    """A chapter points at the code that does what it says: every `path/of/a/file` and every
    `test_name` it quotes must still be there after a rename."""
    text = path.read_text()
    gone = [name for name in NAMED_FILE.findall(text) if not (ROOT / name).exists()]
    assert not gone, f"{path.name} names files that do not exist: {gone}"
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    missing = [n for n in NAMED_TEST.findall(text) if not re.search(rf"def {n}\b", tests)]
    assert not missing, f"{path.name} names tests that do not exist: {missing}"


def test_the_checks_themselves(tmp_path: Path) -> None:
    """The parser and the plain-block checks on a made-up chapter: an indented runnable block
    inside a list item, a plain block with one good and four stale commands."""
    chapter = tmp_path / "demo.md"
    chapter.write_text(
        "1. Step\n\n   ```sh runnable\n   mega --help\n   ```\n\n"
        "```sh\nMEGA_BUS=redis make run PORT=1  # fine\nmake deploy && mega frobnicate\n"
        "docker compose --profile nope up\nhonch -f ecosystem/Procfile\n```\n"
    )
    runnable, plain = fenced_blocks(chapter)
    assert (runnable.info, runnable.line, runnable.text) == ("sh runnable", 3, "mega --help\n")
    assert [c[:2] for c in commands(plain.text)] == [
        ["make", "run"],
        ["make", "deploy"],
        ["mega", "frobnicate"],
        ["docker", "compose"],
        ["honch", "-f"],
    ]
    known = {"make": {"run"}, "mega": {"dev"}, "profiles": {"cluster"}}
    found = [p for command in commands(plain.text) for p in problems_of(command, known)]
    assert outside_the_venv(plain.text) == [
        "`mega` is the venv's: call .venv/bin/mega or start the block with `. .venv/bin/activate`"
    ]
    assert outside_the_venv(". .venv/bin/activate\nmega dev\npython x.py\n") == []
    assert outside_the_venv(".venv/bin/mega dev && honcho start\n") == [
        "`honcho` is the venv's: call .venv/bin/honcho or start the block with "
        "`. .venv/bin/activate`"
    ]
    assert found == [
        "no make target 'deploy'",
        "`mega frobnicate` is not in `mega --help`",
        "docker-compose.yml has no profile 'nope'",
        "unknown program 'honch' (add it to KNOWN_PROGRAMS or run the block)",
    ]
    assert slug("Limits that differ: `--apply-limits`") == "limits-that-differ---apply-limits"
