"""A job's postprocessors run as its owner, in a process of their own (a multi-user service).

User-named postprocessors (``CustomMerger``, ``CustomChecker``, a third
party's kinds) run the user's code; the built-in mergers and checkers read
the files the user's runs wrote. For a job of another user than the
orchestrator's, each runs in ``python -c`` as the owner, with the owner's
uid, gid and groups, never in the service's process: :func:`run_as_owner`
starts it and reads its answer, :func:`main` is the child's side. The child
gets the postprocessor's stored description and the context as JSON on
stdin, and answers ``{"error": ..., "failed_subjobs": [[index, reason]]}``
on a descriptor of its own (what the user's code prints goes to stderr).

The child is waited for on the event loop, not in a worker thread: the
user's code may never end, and the worker threads are every job's (a
runtime's reads of its runs' ends, the starts of ``local`` runs). Forty
mergers that slept for ever took them all, and the service stopped for
every user. Of what the child prints only the last bytes are kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream

from ..core.statuses import JobStatus
from ..core.stored import kept
from ..plugin.postprocess import PostprocessContext, PostprocessResult, SubjobOutput
from ..plugin.users import OUTPUT_KEPT, Identity, owner_environ, python_for, site_dirs

#: The most of the child's stdout kept (its last bytes): its answer, on its last line, is in it; an answer over
#: this is no answer (the child is the owner's: what it printed was kept whole, in the service's memory).
ANSWER_KEPT = 16 << 20
#: Most characters of the child's stderr quoted in a failure's reason.
STDERR_QUOTED = 300


def _boot(paths: list[str]) -> str:
    return ("import site, sys\n"
            f"for d in {site_dirs()!r}: site.addsitedir(d)\n"
            f"sys.path.extend(p for p in {paths!r} if p not in sys.path)\n"
            "from orchestrator.runtime.postrun import main\n"
            "main()\n")


def _request(descriptor: Mapping[str, Any], context: PostprocessContext) -> bytes:
    return json.dumps({
        "postprocessor": descriptor,
        "context": {"fqid": context.fqid, "name": context.name, "outputdir": str(context.outputdir),
                    "subjobs": [[s.index, s.status.value, str(s.outputdir), s.reason] for s in context.subjobs],
                    "counts": dict(context.counts)},
    }).encode()


async def run_as_owner(who: Identity, descriptor: Mapping[str, Any], context: PostprocessContext,
                       kind: str) -> PostprocessResult:
    """Run the postprocessor ``descriptor`` (``{"plugin": ..., "params": ...}``) as ``who``; its result, or one
    whose error says why it could not run. Cancelled (the service stopping), the child is killed."""
    python = await anyio.to_thread.run_sync(python_for, who)  # (looked for once an owner: a few seconds at most)
    if python is None:
        return PostprocessResult(f"{kind}: cannot run as its owner {who.name}: no python that {who.name} may run "
                                 "(set [service] python to one)")
    paths = [os.getcwd() if p == "" else p for p in sys.path]
    try:
        code, out, err = await _child(who, [python, "-S", "-c", _boot(paths)], _request(descriptor, context))
    except OSError as exc:
        return PostprocessResult(f"{kind}: could not start as its owner {who.name}: {exc}")
    result = read_answer(out, {s.index for s in context.subjobs})
    if result is None:
        said = err.decode(errors="replace").strip()
        tail = said[-STDERR_QUOTED:] if said else "no output"
        return PostprocessResult(f"{kind}: its process (as {who.name}) ended with exit code {code} "
                                 f"without an answer: {tail}")
    return result


async def _child(who: Identity, argv: list[str], request: bytes) -> tuple[int, bytes, bytes]:
    """``argv`` run as ``who``, ``request`` on its stdin: its exit code, the last :data:`ANSWER_KEPT` bytes of its
    stdout and the last :data:`~orchestrator.plugin.users.OUTPUT_KEPT` of its stderr."""
    out, err = bytearray(), bytearray()
    async with await anyio.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        env=owner_environ(who), cwd="/", user=who.uid, group=who.gid,
                                        extra_groups=list(who.groups)) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        stdin = proc.stdin

        async def feed() -> None:
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):  # it reads no more
                await stdin.send(request)
            await stdin.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            tg.start_soon(_keep, proc.stdout, out, ANSWER_KEPT)
            tg.start_soon(_keep, proc.stderr, err, OUTPUT_KEPT)
        code = await proc.wait()
    return code, bytes(out), bytes(err)


async def _keep(stream: ByteReceiveStream, kept_bytes: bytearray, most: int) -> None:
    """``stream`` read to its end, its last ``most`` bytes kept in ``kept_bytes``."""
    async for chunk in stream:
        kept_bytes += chunk
        if len(kept_bytes) > most:
            del kept_bytes[:len(kept_bytes) - most]  # (from the front: CPython moves no bytes for that)


def read_answer(out: bytes, known: set[int]) -> PostprocessResult | None:
    """The answer on the last line of the owner's process's ``out``, its failed subjobs among ``known``; ``None``
    when there is none. The process is the owner's, and may write anything there: an ``Infinity``, nesting deeper
    than Python recurses, an index of no subjob, each raised past the handler, and the master never ended."""
    tail = out.rstrip()
    try:  # (its last line alone decoded: what came before may be tens of megabytes of the owner's)
        answer = json.loads(tail[tail.rfind(b"\n") + 1:].decode(errors="replace"))
        error = answer.get("error")
        failed = [(int(i), kept(str(why))) for i, why in answer.get("failed_subjobs", [])]
    except (ValueError, IndexError, TypeError, AttributeError, OverflowError, RecursionError):
        return None
    # reasons kept as a run's log's are (16 KiB): they are stored with the master's and the subjobs' records
    return PostprocessResult(kept(str(error)) if error else None,
                             [(i, why) for i, why in failed if i in known])


def main() -> None:
    """The child: the answer on the original stdout, everything else (the user's prints) on stderr."""
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    request = json.loads(sys.stdin.buffer.read())
    answer: dict[str, Any]
    try:
        answer = _run(request)
    except Exception as exc:  # the user's code: any error is the postprocessor's failure, said as today
        kind = request.get("postprocessor", {}).get("plugin", "postprocessor")
        answer = {"error": f"{kind}: {type(exc).__name__}: {exc}", "failed_subjobs": []}
    with os.fdopen(answer_fd, "w") as out:
        out.write("\n" + json.dumps(answer) + "\n")


def _run(request: Mapping[str, Any]) -> dict[str, Any]:
    from . import registry  # the plugins' entry points, loaded in the child only

    post = registry.load_postprocessor(dict(request["postprocessor"]))
    if post is None:
        return {"error": None, "failed_subjobs": []}
    c = request["context"]
    context = PostprocessContext(
        c["fqid"], c["name"], Path(c["outputdir"]),
        [SubjobOutput(int(i), JobStatus(status), Path(out), reason) for i, status, out, reason in c["subjobs"]],
        c["counts"], {}, None)
    try:
        result = post.run(context)
    except Exception as exc:
        return {"error": f"{type(post).__name__}: {type(exc).__name__}: {exc}", "failed_subjobs": []}
    return {"error": result.error, "failed_subjobs": [[i, why] for i, why in result.failed_subjobs]}
