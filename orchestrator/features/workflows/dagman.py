"""HTCondor DAGMan export of the implied DAG, and a reader for it (for checks and round trips).

DAGMan knows nothing of files: the export writes the edges that the file
names imply, one ``PARENT p CHILD c1 c2 ...`` line per producer, each after a
comment naming the files that make the edge. Node names are
``S<stage>_L<line>_P<package>`` (ids contain no ``_``, so names are unique).
Also written: ``RETRY`` (the sum of the package's automatic-retry limits, when
not zero), ``PRIORITY`` (its priority, when not zero), ``DONE`` on packages that
already completed (DAGMan then resumes where the orchestrator is), and
``CATEGORY`` / ``MAXJOBS`` for the workflow's ``slots``. Pure text functions.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .dag import Dag


def node_name(key: str) -> str:
    """``"1.2.3"`` → ``"S1_L2_P3"``."""
    stage, line, package = key.split(".")
    return f"S{stage}_L{line}_P{package}"


def to_dagman(dag: Dag, *, workflow: str, dropped: Iterable[str] = (), retries: Mapping[str, int] | None = None,
              done: Iterable[str] = (), slots: int | None = None, submit_files: Mapping[str, str] | None = None) -> str:
    """The DAG file's text. ``submit_files`` maps a package key to its submit file (default ``<node>.sub``)."""
    gone, finished = set(dropped), set(done)
    retries = retries or {}
    lines = [f"# HTCondor DAGMan file of workflow {workflow}, written by orchestrator.",
             "# Dependencies are implied by file names: each PARENT line follows the files that make it."]
    for key in dag.nodes:
        name = node_name(key)
        sub = (submit_files or {}).get(key, f"{name}.sub")
        lines.append(f"JOB {name} {_quote(sub)}" + (" DONE" if key in finished else ""))
    for key, node in dag.nodes.items():
        if retries.get(key):
            lines.append(f"RETRY {node_name(key)} {retries[key]}")
        if node.priority:
            lines.append(f"PRIORITY {node_name(key)} {node.priority}")
    if slots:
        category = "".join(c if c.isalnum() else "_" for c in workflow)
        lines += [f"CATEGORY {node_name(k)} {category}" for k in dag.nodes]
        lines.append(f"MAXJOBS {category} {slots}")
    for key in dag.nodes:
        kids = dag.children(key, gone)
        if not kids:
            continue
        files = sorted({f for k in kids for f in dag.parents(k, gone).get(key, [])})
        lines.append(f"# {key} makes {' '.join(files)}")
        lines.append(f"PARENT {node_name(key)} CHILD {' '.join(node_name(k) for k in kids)}")
    return "\n".join(lines) + "\n"


def submit_description(*, script: str, datadir: str, node: str, nodes: Sequence[str] = (), priority: int = 0) -> str:
    """A vanilla-universe submit file that runs a package's script (the node restriction list as requirements)."""
    lines = ["universe = vanilla", "executable = /bin/sh", f"arguments = {_quote_args([script])}",
             f"initialdir = {datadir}", f"log = {node}.log", f"output = {node}.out", f"error = {node}.err"]
    if nodes:
        lines.append("requirements = " + " || ".join(f'(Machine == "{n}")' for n in nodes))
    if priority:
        lines.append(f"priority = {priority}")
    lines.append("queue")
    return "\n".join(lines) + "\n"


def _quote(word: str) -> str:
    return f'"{word}"' if any(c.isspace() for c in word) else word


def _quote_args(args: Sequence[str]) -> str:
    """HTCondor's new argument syntax: double quotes around, single quotes around each argument."""
    return '"' + " ".join("'" + a.replace("'", "''").replace('"', '""') + "'" for a in args) + '"'


@dataclass
class DagmanFile:
    """What :func:`parse_dagman` read."""

    jobs: dict[str, str] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    edges: set[tuple[str, str]] = field(default_factory=set)
    retries: dict[str, int] = field(default_factory=dict)
    priorities: dict[str, int] = field(default_factory=dict)
    categories: dict[str, str] = field(default_factory=dict)
    maxjobs: dict[str, int] = field(default_factory=dict)


def parse_dagman(text: str) -> DagmanFile:
    """Read the DAGMan commands this module writes (JOB, PARENT/CHILD, RETRY, PRIORITY, CATEGORY, MAXJOBS).

    Raises ``ValueError`` naming the line for anything malformed or for an edge
    to an undeclared node.
    """
    out = DagmanFile()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = shlex.split(line)
        cmd = words[0].upper()
        try:
            if cmd == "JOB":
                out.jobs[words[1]] = words[2]
                if len(words) > 3 and words[3].upper() == "DONE":
                    out.done.add(words[1])
            elif cmd == "PARENT":
                at = [w.upper() for w in words].index("CHILD")
                parents, children = words[1:at], words[at + 1:]
                if not parents or not children:
                    raise ValueError("PARENT needs parents and children")
                out.edges |= {(p, c) for p in parents for c in children}
            elif cmd == "RETRY":
                out.retries[words[1]] = int(words[2])
            elif cmd == "PRIORITY":
                out.priorities[words[1]] = int(words[2])
            elif cmd == "CATEGORY":
                out.categories[words[1]] = words[2]
            elif cmd == "MAXJOBS":
                out.maxjobs[words[1]] = int(words[2])
            else:
                raise ValueError(f"unknown command {words[0]!r}")
        except (IndexError, ValueError) as exc:
            raise ValueError(f"line {number}: {line!r}: {exc}") from None
    for p, c in out.edges:
        for n in (p, c):
            if n not in out.jobs:
                raise ValueError(f"edge {p} -> {c}: node {n} has no JOB line")
    return out
