"""The implied DAG: dependencies from file names, and the rules that read it. Pure: no I/O.

A package depends on the package that produces each of its input files; the
edges are never written, they follow from the names. :func:`build` derives
them and refuses, naming the file, a file produced twice, an input nobody
produces that does not exist, and a cycle. :func:`assess` turns the facts the
runner knows (each package job's status, the hold and kill flags) into each
package's state, the ready set and the workflow's status; :func:`due_files`
says which files every consumer has finished with; :func:`bottom_levels`
orders equal priorities by the work that waits downstream. Every rule is a
function of its arguments, so the tests need neither a loop nor a disk.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ...core import statuses
from .model import FileSpec, Workflow
from .values import WorkflowError

#: Package job statuses in which it holds a slot (statuses are ``str``: a state name is looked up as it is).
ACTIVE = statuses.ACTIVE
#: A producer in one of these has "started", for an ``early_start`` consumer.
STARTED = statuses.STARTED | {statuses.JobStatus.COMPLETED}
#: A consumer in one of these has finished with its inputs.
FINISHED = frozenset({"completed", "killed"})
#: When consumers disagree, the most careful disposition wins.
STRENGTH = {"deletable": 0, "temporary": 1, "retain": 2}
#: Workflow statuses; ``wait()`` returns on any but ``running``.


@dataclass(frozen=True, slots=True)
class Node:
    """One package in the DAG."""

    key: str
    index: int
    stage: str
    line: str
    early_start: bool
    priority: int
    estimate: float | None
    #: Files it needs from outside itself (a file an earlier binary of the package makes is internal).
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass
class Dag:
    """Nodes in definition order, who produces and who consumes each file, a topological order."""

    nodes: dict[str, Node]
    producer: dict[str, str]
    consumers: dict[str, list[str]]
    #: The effective disposition of every file some package consumes or produces.
    disposition: dict[str, str]
    #: Inputs nobody produces, with their merged spec (locator, acquisition).
    external: dict[str, FileSpec]
    order: list[str] = field(default_factory=list)

    def parents(self, key: str, dropped: Iterable[str] = ()) -> dict[str, list[str]]:
        """Producer → the files of ``key`` it makes; dropped files are no longer waited for."""
        gone = set(dropped)
        out: dict[str, list[str]] = {}
        for name in self.nodes[key].inputs:
            p = self.producer.get(name)
            if p is not None and name not in gone:
                out.setdefault(p, []).append(name)
        return out

    def edges(self, dropped: Iterable[str] = ()) -> set[tuple[str, str]]:
        """Every (parent, child) pair."""
        gone = set(dropped)
        return {(p, k) for k in self.nodes for p in self.parents(k, gone)}

    def children(self, key: str, dropped: Iterable[str] = ()) -> list[str]:
        gone = set(dropped)
        kids = {c for name in self.nodes[key].outputs if name not in gone for c in self.consumers.get(name, ())}
        return sorted(kids, key=lambda k: self.nodes[k].index)

    def line(self, stage: str, line: str) -> list[str]:
        return [k for k, n in self.nodes.items() if n.stage == stage and n.line == line]


def _err(wf: Workflow, message: str, file: str | None = None) -> WorkflowError:
    return WorkflowError(message, workflow=wf.id, file=file)


def build(wf: Workflow, exists: Callable[[FileSpec], bool] = lambda spec: False) -> Dag:
    """The DAG of a normalized workflow (``wf.normalized()``).

    ``exists(spec)`` says whether an input nobody produces is available (at its
    locator, or already in the data dir). Raises :class:`WorkflowError` whose
    ``file`` names the file at fault.
    """
    nodes: dict[str, Node] = {}
    producer: dict[str, str] = {}
    consumers: dict[str, list[str]] = {}
    in_specs: dict[str, list[FileSpec]] = {}
    out_specs: dict[str, FileSpec] = {}
    for index, (key, stage, line, pkg) in enumerate(wf.packages()):
        made_by: dict[str, int] = {}
        for bi, b in enumerate(pkg.binaries):
            for f in b.outputs:
                if f.name in producer or f.name in made_by:
                    other = producer.get(f.name, key)
                    raise _err(wf, f"file {f.name!r} is produced twice: by package {other} and by package {key}",
                               f.name)
                made_by[f.name] = bi
        needs: list[str] = []
        for bi, b in enumerate(pkg.binaries):
            for f in b.inputs:
                at = made_by.get(f.name)
                if at is not None and at >= bi:
                    raise _err(wf, f"cycle inside package {key}: binary {bi + 1} needs file {f.name!r}, which "
                                   f"binary {at + 1} of the same package makes", f.name)
                if at is None:
                    in_specs.setdefault(f.name, []).append(f)
                    if f.name not in needs:
                        needs.append(f.name)
        for b in pkg.binaries:
            for f in b.outputs:
                producer[f.name] = key
                out_specs[f.name] = f
        for name in needs:
            consumers.setdefault(name, []).append(key)
        outputs = tuple(f.name for b in pkg.binaries for f in b.outputs)
        nodes[key] = Node(key, index, str(stage.id), str(line.id), line.early_start, pkg.priority, pkg.estimate,
                          tuple(needs), outputs)
    external = _externals(wf, consumers, producer, in_specs, exists)
    disposition = {name: max((s.disposition or "retain" for s in specs), key=STRENGTH.__getitem__)
                   for name, specs in in_specs.items()}
    for name, spec in out_specs.items():
        if name not in consumers:
            disposition[name] = spec.disposition or "retain"
    dag = Dag(nodes, producer, consumers, disposition, external)
    dag.order = _toposort(wf, dag)
    return dag


def _externals(wf: Workflow, consumers: Mapping[str, list[str]], producer: Mapping[str, str],
               in_specs: Mapping[str, list[FileSpec]], exists: Callable[[FileSpec], bool]) -> dict[str, FileSpec]:
    external: dict[str, FileSpec] = {}
    for name, specs in in_specs.items():
        users = consumers[name]
        if name in producer:
            bad = next((s for s in specs if s.locator is not None or s.acquisition != "none"), None)
            if bad is not None:
                raise _err(wf, f"file {name!r} is produced by package {producer[name]}: its consumers may give it "
                               "no locator or acquisition", name)
            continue
        locators = {s.locator for s in specs if s.locator is not None}
        if len(locators) > 1:
            raise _err(wf, f"file {name!r} has two locators: {', '.join(sorted(locators))}", name)
        acquisitions = {s.acquisition for s in specs}
        acquisition = next((a for a in ("prefetch", "copy") if a in acquisitions), "none")
        size = next((s.size for s in specs if s.size is not None), None)
        merged = FileSpec(name, locator=next(iter(locators), None), size=size, acquisition=acquisition)
        if acquisition != "none" and merged.locator is None:
            raise _err(wf, f"file {name!r} has acquisition {acquisition!r} but no locator to acquire it from", name)
        if not exists(merged):
            where = f"not at its locator {merged.locator}" if merged.locator else "not in the data dir (no locator)"
            raise _err(wf, f"file {name!r}, an input of package {users[0]}, is produced by no package and does not "
                           f"exist ({where})", name)
        external[name] = merged
    return external


def _toposort(wf: Workflow, dag: Dag) -> list[str]:
    """Kahn's algorithm, stable in definition order; a cycle is reported by the files along it."""
    indegree = {k: len(dag.parents(k)) for k in dag.nodes}
    ready = deque(k for k in dag.nodes if indegree[k] == 0)
    order: list[str] = []
    while ready:
        key = ready.popleft()
        order.append(key)
        for child in dag.children(key):
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    if len(order) == len(dag.nodes):
        return order
    done = set(order)
    left = {k for k in dag.nodes if k not in done}
    key = min(left, key=lambda k: dag.nodes[k].index)
    path: list[tuple[str, str, str]] = []  # (package, needs file, from package)
    seen: dict[str, int] = {}
    while key not in seen:
        seen[key] = len(path)
        parent, files = next((p, fs) for p, fs in dag.parents(key).items() if p in left)
        path.append((key, files[0], parent))
        key = parent
    cycle = path[seen[key]:]
    steps = "; ".join(f"package {k} needs {f!r} from package {p}" for k, f, p in cycle)
    raise _err(wf, f"dependency cycle through file {cycle[0][1]!r}: {steps}", cycle[0][1])


@dataclass(frozen=True, slots=True)
class Facts:
    """What the runner knows of one package."""

    #: The package job's status; ``None`` while it has no job (or ``"new"``: not submitted).
    job: str | None = None
    hold: bool = False
    killed: bool = False
    #: Why it could not be started (staging or submission failed), until restarted.
    error: str | None = None


@dataclass
class Assessment:
    #: Per package: ``waiting``, ``ready``, ``held``, ``killed``, ``failed``, or its job's status.
    states: dict[str, str]
    ready: list[str]
    #: Per package not started: the input files it still waits for.
    waiting_for: dict[str, list[str]]
    status: str
    active: int


def _satisfied(dag: Dag, key: str, facts: Mapping[str, Facts], dropped: set[str]) -> list[str]:
    """The inputs of ``key`` not yet available: their producer has not completed (or, early_start, started)."""
    need = STARTED if dag.nodes[key].early_start else frozenset({"completed"})
    return [name for p, names in dag.parents(key, dropped).items()
            if facts.get(p, Facts()).job not in need for name in names]


def assess(dag: Dag, facts: Mapping[str, Facts], dropped: Iterable[str] = (), hold: bool = False) -> Assessment:
    """Each package's state, the ready set, and the workflow's status.

    The status is ``running`` while something runs or can start; otherwise
    ``held`` (something waits for a release), ``failed`` (a package failed),
    ``blocked`` (packages wait for files that killed packages will not make),
    ``killed`` (everything was killed) or ``completed``.
    """
    gone = set(dropped)
    states: dict[str, str] = {}
    waiting_for: dict[str, list[str]] = {}
    fate: dict[str, str] = {}
    for key in dag.order:
        f = facts.get(key, Facts())
        if f.job not in (None, "new"):
            state = str(f.job)
        elif f.killed:
            state = "killed"
        elif f.error:
            state = "failed"
        else:
            missing = _satisfied(dag, key, facts, gone)
            waiting_for[key] = missing
            state = "held" if f.hold or hold else "waiting" if missing else "ready"
        states[key] = state
        if state == "completed":
            fate[key] = "done"
        elif state in ("failed", "killed"):
            fate[key] = "dead"
        elif state in ACTIVE or state == "ready":
            fate[key] = "live"
        else:  # waiting, or held (by a flag, or a job the application held)
            upstream = {fate[p] for p in dag.parents(key, gone) if fate[p] != "done"}
            if upstream & {"dead", "blocked"}:
                fate[key] = "blocked"
            elif state == "held" or "held" in upstream:
                fate[key] = "held"
            else:
                fate[key] = "live"
    fates = set(fate.values())
    if "live" in fates:
        status = "running"
    elif "held" in fates:
        status = "held"
    elif "failed" in states.values():
        status = "failed"
    elif "blocked" in fates:
        status = "blocked"
    elif states and all(s == "killed" for s in states.values()):
        status = "killed"
    else:
        status = "completed"
    ready = [k for k in dag.order if states[k] == "ready"]
    return Assessment(states, ready, waiting_for, status, sum(1 for s in states.values() if s in ACTIVE))


def due_files(dag: Dag, states: Mapping[str, str], dropped: Iterable[str] = ()) -> list[tuple[str, str]]:
    """``(file, disposition)`` of every file that exists and whose consumers have all finished."""
    gone = set(dropped)
    out = []
    for name, users in dag.consumers.items():
        p = dag.producer.get(name)
        if name in gone or (p is not None and states.get(p) != "completed"):
            continue
        if all(states.get(c) in FINISHED for c in users):
            out.append((name, dag.disposition[name]))
    return out


def bottom_levels(dag: Dag, default_estimate: float = 1.0) -> dict[str, float]:
    """The longest run-time path from each package to the end of the DAG (itself included).

    Among equal priorities the package with most work waiting behind it starts
    first (the classic critical-path rule); without estimates each package counts 1.
    """
    level: dict[str, float] = {}
    for key in reversed(dag.order):
        own = dag.nodes[key].estimate
        below = max((level[c] for c in dag.children(key)), default=0.0)
        level[key] = (default_estimate if own is None else own) + below
    return level

