"""The docs as tests: every code block of README.md and docs/*.md, run by Sybil (wired in the root conftest.py).

Each Markdown file is one session with a fresh home (``ORCHESTRATOR_HOME``) and a fresh working directory (holding
a copy of the clone's ``examples/`` and ``config/``, and ``.venv`` linked to the running venv), shared by its blocks
in order:

- ``python`` blocks run in the document's namespace (Sybil's), in that directory, with that home;
- ``sh``/``bash``/``shell`` blocks run with ``bash -e -o pipefail`` there, the venv's ``bin`` first on ``PATH``
  (so ``orchestrator`` is the project's command): a block fails when any of its commands fails;
- ``toml`` and ``json`` blocks are parsed (``toml`` fragments of a larger file are parsed as they stand);
- other blocks (diagrams, file layouts, sample output) are prose.

Directives, HTML comments a reader does not see rendered (the skip's visible sentence is the rule, below):

- ``<!-- file: PATH -->`` just before a block (of any language, ``text`` included): write the block to PATH in the
  working directory, for the blocks after it (Python is compiled, TOML and JSON parsed, shell made executable; a
  written block is not run itself);
- ``<!-- docs: job -->`` just before a ``sh`` block: it is a job's script (it uses ``$ORCH_LOG``...): run it as a
  job on ``local`` and require that the job completed;
- ``<!-- docs: serve -->`` on a line of its own: start ``orchestrator serve`` on the document's home, stopped by
  its PID when the document ends;
- ``<!-- skip: next "illustration: WHY" -->`` (Sybil's): the next block is not run; a visible sentence
  ``(illustration, not run: WHY)`` ends within the 6 lines before the directive, for the reader.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from sybil import Document, Example, Lexeme, Region, Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import SkipParser
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: Seconds a shell block or a job block may take before it fails (the slowest documented wait is 60 s).
BLOCK_TIMEOUT = 300.0
LANGUAGES = {"python": "python", "py": "python", "sh": "shell", "bash": "shell", "shell": "shell",
             "toml": "toml", "json": "json"}
DIRECTIVE = re.compile(r"<!--\s*(?P<kind>file|docs):\s*(?P<arg>[^\s>][^>]*?)\s*-->\s*\Z")
STANDALONE = re.compile(r"^<!--\s*docs:\s*(?P<arg>serve)\s*-->[ \t]*$", re.MULTILINE)
ILLUSTRATION = "(illustration, not run:"
#: Copied into each document's working directory, which stands for the clone's root.
CLONE_FILES = ("examples", "config")

#: What the blocks did in this pytest process: ``executed``, ``written``, ``parsed`` (printed by the summary).
tally: Counter[str] = Counter()


@dataclass
class Session:
    """One document's home, working directory and the services started for it."""

    base: Path
    services: list[Any] = field(default_factory=list)  # served.Service

    @property
    def home(self) -> Path:
        return self.base / "home"

    @property
    def cwd(self) -> Path:
        return self.base / "work"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["ORCHESTRATOR_HOME"] = str(self.home)
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        env.pop("PYTHONPATH", None)
        env.pop("ORCHESTRATOR_AUTOSTART", None)  # as a user runs them: a home is watched (the suite's default is off)
        return env


def setup(namespace: dict[str, Any]) -> None:
    base = Path(tempfile.mkdtemp(prefix="orch-docs-"))
    session = Session(base)
    session.home.mkdir()
    session.cwd.mkdir()
    for name in CLONE_FILES:  # the README's commands name them from the clone's root
        shutil.copytree(ROOT / name, session.cwd / name)
    (session.cwd / ".venv").symlink_to(BIN.parent)  # `. .venv/bin/activate` as in the clone
    namespace["__docs_session__"] = session


def teardown(namespace: dict[str, Any]) -> None:
    session: Session = namespace["__docs_session__"]
    took: dict[str, float] = {}
    t0 = time.monotonic()
    for service in session.services:
        service.stop()
    took["services"] = time.monotonic() - t0
    stop_background_service(session.home)
    took["background service"] = time.monotonic() - t0 - sum(took.values())
    stop_supervisord(session.home)
    took["supervisord"] = time.monotonic() - t0 - sum(took.values())
    try:
        left = active_jobs(session.home)
        took["reading the home"] = time.monotonic() - t0 - sum(took.values())
        assert not left, f"the document left jobs running (wait for them in the doc): {left}"
    finally:
        shutil.rmtree(session.base, ignore_errors=True)
    if sum(took.values()) > SLOW_TEARDOWN:  # said in the run's summary: a slow stop is a fault to look into
        warnings.warn(f"a document's teardown took {sum(took.values()):.1f} s: "
                      + ", ".join(f"{k} {v:.1f} s" for k, v in took.items()), stacklevel=1)


#: Seconds past which a document's teardown is reported (a service stops within 10 s of its SIGTERM).
SLOW_TEARDOWN = 10.0


def active_jobs(home: Path) -> list[str]:
    """The jobs of the home still active as last stored: a document waits for what it starts."""
    from orchestrator import Orchestrator

    if not (home / "repository.sqlite").exists():
        return []

    async def read() -> list[str]:
        async with Orchestrator(home=home, readonly=True, service=False) as orch:
            return [str(job.fqid) for job in orch.jobs if job.is_active()]

    return anyio.run(read)


def stop_background_service(home: Path) -> None:
    """A service the blocks started on this home (``orchestrator serve &``, or one started to watch it): SIGTERM
    by the PID its ``service.json`` names, when that process runs on this home."""
    try:
        pid = int(json.loads((home / "service" / "service.json").read_text())["pid"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return
    if str(home).encode() in cmdline:
        os.kill(pid, signal.SIGTERM)
        wait_gone(pid)  # it writes what it holds as it stops: the home is read after, not while


def wait_gone(pid: int, timeout: float = 15.0) -> None:
    """Until process ``pid`` is gone (its own child: reaped), SIGKILL past ``timeout``."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass  # not ours: its parent reaps it
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return  # a zombie: it has stopped
        except (OSError, IndexError):
            return
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = math.inf
        time.sleep(0.05)


def stop_supervisord(home: Path) -> None:
    """A supervisord a block started with ``config/supervisord.conf`` on this home and left running (the block
    failed before its ``shutdown``): SIGTERM by the PID in the home's ``supervisord.pid``."""
    try:
        pid = int((home / "supervisord.pid").read_text())
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except (OSError, ValueError):
        return
    if f"ORCHESTRATOR_HOME={home}".encode() in environ.split(b"\0"):
        os.kill(pid, signal.SIGTERM)
        wait_gone(pid)


def session_of(example: Example) -> Session:
    session: Session = example.namespace["__docs_session__"]
    return session


# ---------------------------------------------------------------- evaluators
def run_python(example: Example) -> None:
    __tracebackhide__ = True
    session = session_of(example)
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(session.env())
    os.chdir(session.cwd)
    try:
        PythonEvaluator()(example)
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    tally["executed"] += 1


def run_shell(example: Example) -> None:
    __tracebackhide__ = True
    session = session_of(example)
    try:
        result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", str(example.parsed)], cwd=session.cwd,
                                env=session.env(), capture_output=True, text=True, timeout=BLOCK_TIMEOUT,
                                stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the block ran for more than {BLOCK_TIMEOUT:g} s\n{exc.stdout!r}\n"
                             f"{exc.stderr!r}") from None
    if result.returncode != 0:
        raise AssertionError(f"the block exited with {result.returncode}\n"
                             f"--- stdout\n{result.stdout}--- stderr\n{result.stderr}")
    tally["executed"] += 1


def run_as_job(example: Example) -> None:
    """The block is a job's script: run it on ``local`` through the wrapper; the job must complete."""
    __tracebackhide__ = True
    from orchestrator import Executable, Job, Orchestrator

    session = session_of(example)
    script = Path(tempfile.mkdtemp(dir=session.base)) / "block.sh"
    script.write_text(str(example.parsed))

    async def main() -> tuple[str, Any]:
        async with Orchestrator(home=session.base / "jobs-home") as orch:  # apart: the document's ids stay its own
            job = await orch.jobs.add(Job(name=f"docs-line-{example.line}", backend="local",
                                          application=Executable("/bin/sh", args=[str(script)])))
            await job.submit()
            await job.wait(timeout=BLOCK_TIMEOUT)
            return str(job.status), job.info

    status, info = anyio.run(main)
    assert status == "completed", f"the block's job ended {status}: {info.reason}; history {info.history}"
    tally["executed"] += 1


def write_file(path: str, language: str | None) -> Any:
    def evaluate(example: Example) -> None:
        session = session_of(example)
        target = (session.cwd / path).resolve()
        assert target.is_relative_to(session.cwd), f"{path} leaves the document's directory"
        text = str(example.parsed)
        check(language, text, example)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        if language == "shell":
            target.chmod(0o755)
        tally["written"] += 1

    return evaluate


def check(language: str | None, text: str, example: Example) -> None:
    if language == "python":
        compile(text, example.path, "exec")
    elif language == "toml":
        tomllib.loads(text)
    elif language == "json":
        json.loads(text)


def parse_only(language: str) -> Any:
    def evaluate(example: Example) -> None:
        check(language, str(example.parsed), example)
        tally["parsed"] += 1

    return evaluate


def serve(example: Example) -> None:
    from served import Service  # here: the suite registers ``served`` as a plugin, imported once by pytest

    session = session_of(example)
    service = Service(session.home)
    session.services.append(service)
    service.start()


# ---------------------------------------------------------------- parsing
class BlockParser:
    """Every fenced block with a language we run or check, with the directive just before it, if any."""

    def __init__(self) -> None:
        self.lexer = RawFencedCodeBlockLexer(info_pattern=re.compile(r"(?P<language>[^\n]*)$\n", re.MULTILINE))

    def __call__(self, document: Document) -> Iterable[Region]:
        for match in STANDALONE.finditer(document.text):
            yield Region(match.start(), match.end(), parsed=match.group("arg"), evaluator=serve)
        for region in self.lexer(document):
            language = LANGUAGES.get(str(region.lexemes["language"]).strip())
            before = document.text[: region.start].rstrip()
            directive = DIRECTIVE.search(before[before.rfind("\n") + 1:])
            if language is None and not (directive and directive.group("kind") == "file"):
                continue  # prose: a diagram, a layout, sample output
            source = region.lexemes["source"]
            assert isinstance(source, Lexeme)
            region.parsed = source
            if directive and directive.group("kind") == "file":
                region.evaluator = write_file(directive.group("arg"), language)
            elif directive and directive.group("arg") == "job":
                if language != "shell":
                    raise ValueError(f"{document.path}: 'docs: job' is for sh blocks, not {language}")
                region.evaluator = run_as_job
            elif directive:
                raise ValueError(f"{document.path}: unknown directive {directive.group(0)!r}")
            elif language == "python":
                region.evaluator = run_python
            elif language == "shell":
                region.evaluator = run_shell
            elif language is not None:
                region.evaluator = parse_only(language)
            yield region


def unexplained_skips(text: str) -> list[int]:
    """Lines of skip directives without the visible ``(illustration, not run: ...)`` sentence just before."""
    lines = text.splitlines()
    bad = []
    for i, line in enumerate(lines):
        explained = any(ILLUSTRATION in previous for previous in lines[max(0, i - 6):i])
        if line.lstrip().startswith("<!-- skip:") and not explained:
            bad.append(i + 1)
    return bad


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


sybil = Sybil(parsers=[BlockParser(), SkipParser()], path=str(ROOT), patterns=["README.md", "docs/*.md"],
              setup=setup, teardown=teardown)
