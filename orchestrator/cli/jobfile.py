"""Job files: a job written in TOML, loaded into a :class:`~orchestrator.api.job.Job`.

```toml
name = "scan"
inputfiles = ["data/a.txt"]       # relative paths resolve against the job file's directory
outputfiles = ["out.txt"]
mode = "production"
comment = "first pass"              # free text, shown by orchestrator show
metadata = { run = 42 }             # any table, kept with the job
fail_on_missing_output = true       # an outputfiles pattern that matched nothing fails the run (the default)
[application]
exe = "/bin/echo"                 # a relative path naming a file next to the job file resolves too
args = ["x"]
env = { A = "1" }
[backend]
name = "local"                    # the other keys are the backend's settings
[splitter]
type = "args"                     # an entry-point name of orchestrator.splitters
args = [["a"], ["b"]]
# or: type = "args" with range = "0-99" (Slurm's --array: "0-99:5", "1,3,5-7") and template = ["x", "{}"];
# or: type = "product", template = ["--e", "{e}", "--seed", "{seed}"], [splitter.params] e = [10, 20], seed = "1-5"
#     (every combination, the last parameter fastest, as Snakemake's expand), env = { SEED = "{seed}" } optional
[merger]
type = "text"                     # an entry-point name of orchestrator.mergers
files = ["stdout"]
[retry]
max_early = 2
```

Everything is checked before the job reaches an orchestrator, the splitter
included (it is run once, dry: splitters are pure), so a bad file never
leaves a job behind. Each problem raises :class:`JobFileError`, a
``JobError`` whose message names the file and whose ``field`` names the key.
"""

from __future__ import annotations

import difflib
import inspect
import itertools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..api.job import Job
from ..core.errors import JobError
from ..core.model import Backend, Executable, RetryPolicy
from ..core.splitters import ArgSplitter, GenericSplitter, Master
from ..plugin.settings import SettingsError
from ..runtime.registry import driver_class, postprocessor_class, splitter_class
from ..runtime.tomlfile import read_toml

TOP_KEYS = ("name", "inputfiles", "outputfiles", "mode", "application", "backend", "splitter", "merger", "retry",
            "comment", "metadata", "fail_on_missing_output")
APPLICATION_KEYS = ("exe", "args", "env")
MODES = ("test", "production")
DEMO_SCRIPT = "sleep $(( $1 % 3 + 1 )); echo subjob $1: $(( $1 * $1 ))"  # a second or three: the progress shows


class JobFileError(JobError):
    """A job file is unreadable or invalid: ``job file PATH: message [field F]``."""

    def __init__(self, path: str | os.PathLike[str], message: str, field: str | None = None) -> None:
        super().__init__(f"job file {path}: {message}", field=field)
        self.path = Path(path)


def load_job(path: str | os.PathLike[str]) -> Job:
    """Read and check the job file at ``path``; the job is new, not yet added to an orchestrator."""
    path = Path(path).expanduser()
    return job_from_dict(read_toml(path, JobFileError), path)


def job_from_dict(data: Mapping[str, Any], path: str | os.PathLike[str]) -> Job:
    """Build a job from a parsed job file; ``path`` names it in errors and anchors relative paths."""
    return _Loader(Path(path)).job(data)


def demo_job_text(n: int) -> str:
    """The job file of ``orchestrator demo``: ``sh -c 'echo subjob $1: $(( $1 * $1 ))' sh i`` for i < n."""

    def array(*values: str) -> str:
        return "[" + ", ".join(json.dumps(v) for v in values) + "]"  # a JSON string is a TOML basic string

    return "\n".join([
        "# Written by `orchestrator demo`: each subjob sleeps a little and squares its index;",
        "# the merger concatenates their stdout.",
        "# Run it again with: orchestrator submit <this file> --wait",
        'name = "demo"',
        "",
        "[application]",
        'exe = "/bin/sh"',
        f"args = {array('-c', DEMO_SCRIPT, 'sh')}",
        "",
        "[backend]",
        'name = "local"',
        "",
        "[splitter]",
        'type = "args"',
        "args = [",
        *(f"    {array('-c', DEMO_SCRIPT, 'sh', str(i))}," for i in range(n)),
        "]",
        "",
        "[merger]",
        'type = "text"',
        'files = ["stdout"]',
        "",
    ])


def _bare(exc: JobError) -> str:
    """A core ``JobError``'s message without its ``job X:`` prefix and ``[field F]`` suffix."""
    text = str(exc)
    prefix = f"job {exc.fqid}: " if exc.fqid is not None else ""
    suffix = f" [field {exc.field}]" if exc.field else ""
    if prefix and text.startswith(prefix):
        text = text[len(prefix):]
    if suffix and text.endswith(suffix):
        text = text[: -len(suffix)]
    return text


def _type_name(value: Any) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "an array",
             dict: "a table"}
    return names.get(type(value), type(value).__name__)


class _Loader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.base = path.resolve().parent
        #: The application's own environment, which a product's ``env`` adds to.
        self._env: dict[str, str] = {}

    def fail(self, message: str, field: str | None = None) -> JobFileError:
        return JobFileError(self.path, message, field)

    def unknown(self, keys: Any, known: tuple[str, ...], where: str = "") -> None:
        for key in keys:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"expected one of: {', '.join(known)}"
                raise self.fail(f"unknown key {key!r} ({hint})", f"{where}{key}")

    # ------------------------------------------------------------ values
    def string(self, value: Any, field: str) -> str:
        if not isinstance(value, str):
            raise self.fail(f"must be a string, not {_type_name(value)}", field)
        return value

    def boolean(self, value: Any, field: str) -> bool | None:
        if value is not None and not isinstance(value, bool):
            raise self.fail(f"must be true or false, not {_type_name(value)}", field)
        return value

    def table(self, value: Any, field: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(f"must be a table, not {_type_name(value)}", field)
        return value

    def strings(self, value: Any, field: str) -> list[str]:
        return self._items(value, field, lambda item: isinstance(item, str) and bool(item), "a non-empty string",
                           repr)

    def scalar_strings(self, value: Any, field: str) -> list[str]:
        """An array of strings or numbers, as strings (command-line arguments)."""
        items = self._items(value, field, lambda item: not isinstance(item, bool)
                            and isinstance(item, (str, int, float)), "a string or a number", _type_name)
        return [str(v) for v in items]

    def _items(self, value: Any, field: str, good: Callable[[Any], bool], what: str,
               shown: Callable[[Any], str]) -> list[Any]:
        """``value`` as an array whose every item is ``good``; else the error names the field and the item."""
        if not isinstance(value, list):
            raise self.fail(f"must be an array of strings, not {_type_name(value)}", field)
        for i, item in enumerate(value):
            if not good(item):
                raise self.fail(f"item {i} must be {what}, not {shown(item)}", field)
        return value

    def local_path(self, value: str) -> Path:
        p = Path(value).expanduser()
        return p if p.is_absolute() else self.base / p

    # -------------------------------------------------------------- parts
    def job(self, data: Mapping[str, Any]) -> Job:
        self.unknown(data, TOP_KEYS)
        name = self.string(data.get("name", self.path.stem), "name")
        mode = self.string(data.get("mode", "production"), "mode")
        if mode not in MODES:
            raise self.fail(f"must be 'test' or 'production', not {mode!r}", "mode")
        if "application" not in data:
            raise self.fail("the [application] table is missing (it needs at least exe)", "application")
        job = Job(
            name=name,
            application=self.application(data["application"]),
            inputfiles=self.inputfiles(data.get("inputfiles", [])),
            outputfiles=self.outputfiles(data.get("outputfiles", [])),
            splitter=self.plugin(data, "splitter", splitter_class),
            merger=self.plugin(data, "merger", postprocessor_class),
            backend=self.backend(data.get("backend", "local")),
            retry=self.retry(data.get("retry", {})),
            mode=mode,
            comment=self.string(data.get("comment", ""), "comment"),
            metadata=self.table(data.get("metadata", {}), "metadata"),
            fail_on_missing_output=self.boolean(data.get("fail_on_missing_output"), "fail_on_missing_output"),
        )
        if job.splitter is not None:
            self.dry_split(job)
        return job

    def application(self, value: Any) -> Executable:
        table = self.table(value, "application")
        self.unknown(table, APPLICATION_KEYS, "application.")
        if "exe" not in table:
            raise self.fail("the executable is missing", "application.exe")
        exe = self.string(table["exe"], "application.exe")
        if not exe.strip():
            raise self.fail("the executable must not be empty", "application.exe")
        if "/" in exe and not os.path.isabs(exe) and self.local_path(exe).is_file():
            exe = str(self.local_path(exe))
        args = self.scalar_strings(table.get("args", []), "application.args")
        env = self.table(table.get("env", {}), "application.env")
        for key, val in env.items():
            if isinstance(val, bool) or not isinstance(val, (str, int, float)):
                raise self.fail(f"the value of {key} must be a string, not {_type_name(val)}", "application.env")
        self._env = {k: str(v) for k, v in env.items()}
        app = Executable(exe, args=args, env=dict(self._env))
        try:
            app.validate(str(self.path))
        except JobError as exc:
            raise self.fail(_bare(exc), exc.field) from None
        return app

    def inputfiles(self, value: Any) -> list[str]:
        files = []
        for item in self.strings(value, "inputfiles"):
            p = self.local_path(item)
            if not p.is_file():
                raise self.fail(f"input file {item!r} does not exist or is not a file (looked at {p})", "inputfiles")
            files.append(str(p))
        return files

    def outputfiles(self, value: Any) -> list[str]:
        patterns = self.strings(value, "outputfiles")
        for pattern in patterns:
            if pattern.startswith("/") or ".." in Path(pattern).parts:
                raise self.fail(f"{pattern!r} escapes the job's directory", "outputfiles")
        return patterns

    def backend(self, value: Any) -> Backend:
        if isinstance(value, str):
            name, settings = value, {}
        else:
            settings = dict(self.table(value, "backend"))
            name = self.string(settings.pop("name", "local"), "backend.name")
        try:
            cls = driver_class(name)
        except KeyError as exc:
            raise self.fail(str(exc.args[0]), "backend.name") from None
        try:
            cls.validate_settings(settings)
        except SettingsError as exc:
            raise self.fail(str(exc), f"backend.{exc.field}") from None
        return Backend(name, **settings)

    def plugin(self, data: Mapping[str, Any], what: str, lookup: Callable[[str], type[Any]]) -> Any:
        if what not in data:
            return None
        params = dict(self.table(data[what], what))
        if "type" not in params:
            example = "args" if what == "splitter" else "text"
            raise self.fail(f'the {what}\'s type is missing (e.g. type = "{example}")', f"{what}.type")
        kind = self.string(params.pop("type"), f"{what}.type")
        if what == "splitter" and (kind == "product" or (kind == "args" and "range" in params)):
            return self.expanded_splitter(kind, params)
        try:
            cls = lookup(kind)
        except KeyError as exc:
            raise self.fail(str(exc.args[0]), f"{what}.type") from None
        self.check_signature(cls, params, what)
        try:
            return cls(**params)
        except JobError as exc:
            raise self.fail(_bare(exc), exc.field or what) from None
        except (TypeError, ValueError) as exc:
            raise self.fail(f"{cls.__name__}: {exc}", what) from None

    # ------------------------------------------------------------ ranges and products of parameters
    def expanded_splitter(self, kind: str, params: Mapping[str, Any]) -> Any:
        """``type = "args"`` with ``range`` (Slurm's ``--array``), or ``type = "product"`` (every combination of
        ``params``, as Snakemake's ``expand``): made here into the stored splitters they amount to."""
        if kind == "args":
            self.unknown(params, ("range", "template"), "splitter.")
            values = self.values(params["range"], "splitter.range")
            template = self.template(params.get("template", ["{}"]), {"": values[0]})
            return ArgSplitter([[t.replace("{}", v) for t in template] for v in values])
        self.unknown(params, ("params", "template", "env"), "splitter.")
        table = self.table(params.get("params", {}), "splitter.params")
        if not table:
            raise self.fail('a product needs its parameters, e.g. [splitter.params] seed = "1-5"', "splitter.params")
        names = list(table)
        columns = [self.values(table[n], f"splitter.params.{n}") for n in names]
        combos = [dict(zip(names, combo, strict=True)) for combo in itertools.product(*columns)]
        if "template" not in params:
            raise self.fail('a product needs the arguments it makes, e.g. template = ["run.sh", "{seed}"]',
                            "splitter.template")
        template = self.template(params["template"], combos[0])
        attrs: dict[str, Sequence[Any]] = {"application.args": [[t.format_map(c) for t in template] for c in combos]}
        if "env" in params:
            env = {k: str(v) for k, v in self.table(params["env"], "splitter.env").items()}
            self.template(list(env.values()), combos[0], "splitter.env")
            base = dict(self._env)
            attrs["application.env"] = [{**base, **{k: v.format_map(c) for k, v in env.items()}} for c in combos]
        return GenericSplitter(multi_attrs=attrs)

    def values(self, value: Any, field: str) -> list[str]:
        """A list of values, or a range as Slurm's ``--array`` writes it: ``0-99``, ``0-99:5``, ``1,3,5-7``."""
        if isinstance(value, list):
            if not value:
                raise self.fail("the list of values is empty", field)
            return self.scalar_strings(value, field)
        text = self.string(value, field)
        out: list[str] = []
        for part in text.split(","):
            span, _, step = part.strip().partition(":")
            lo, dash, hi = span.partition("-")
            try:
                first, last, every = int(lo), int(hi) if dash else int(lo), int(step) if step else 1
            except ValueError:
                raise self.fail(f"{text!r} is not a range (e.g. \"0-99\", \"0-99:5\", \"1,3,5-7\")", field) from None
            if last < first or every < 1:
                raise self.fail(f"{part.strip()!r} is an empty range", field)
            out.extend(str(i) for i in range(first, last + 1, every))
        return out

    def template(self, value: Any, example: Mapping[str, str], field: str = "splitter.template") -> list[str]:
        """Strings whose ``{name}`` placeholders name a product's parameters (``{{`` for a brace), checked once
        against ``example``; a range's template has ``{}`` only (``example`` then has the key ``""``)."""
        items = self.scalar_strings(value, field)
        if "" in example:
            return items
        for item in items:
            try:
                item.format_map(example)
            except KeyError as exc:
                raise self.fail(f"{item!r} names {{{exc.args[0]}}}, which is not a parameter (they are: "
                                f"{', '.join(example)})", field) from None
            except (ValueError, IndexError) as exc:
                raise self.fail(f"{item!r}: {exc} (write {{{{ for a brace)", field) from None
        return items

    def check_signature(self, cls: type[Any], params: Mapping[str, Any], what: str) -> None:
        """Name the parameter that is unknown or missing, before the constructor's TypeError would."""
        try:
            sig = inspect.signature(cls)
        except (TypeError, ValueError):
            return
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        named = {p.name: p for p in sig.parameters.values() if p.kind in kinds}
        if not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
            for key in params:
                if key not in named:
                    known = ", ".join(["type", *named]) or "type"
                    raise self.fail(f"{cls.__name__} takes no parameter {key!r} (it takes: {known})", f"{what}.{key}")
        for pname, p in named.items():
            if p.default is inspect.Parameter.empty and pname not in params:
                raise self.fail(f"{cls.__name__} needs the parameter {pname!r}", f"{what}.{pname}")

    def retry(self, value: Any) -> RetryPolicy:
        table = self.table(value, "retry")
        self.unknown(table, tuple(RetryPolicy.__dataclass_fields__), "retry.")
        policy = RetryPolicy(**table)
        try:
            policy.validate(str(self.path))
        except JobError as exc:
            raise self.fail(_bare(exc), exc.field) from None
        return policy

    def dry_split(self, job: Job) -> None:
        """Run the (pure) splitter once, so that bad splitter values are reported against the file."""
        assert job.splitter is not None
        from ..core.splitters import apply_delta

        spec = job.spec()
        try:
            deltas = job.splitter.split(Master(str(self.path), spec, 1, job.name))
            if not deltas:
                raise self.fail("the splitter made no subjobs", "splitter")
            for i, delta in enumerate(deltas):
                app = apply_delta(spec, delta).get("application") or {}
                try:
                    Executable(app.get("exe", ""), app.get("args", []), app.get("env", {})).validate(str(self.path))
                except JobError as exc:
                    raise self.fail(f"subjob {i}: {_bare(exc)} ({exc.field})", "splitter") from None
        except JobFileError:
            raise
        except JobError as exc:
            raise self.fail(_bare(exc), exc.field or "splitter") from None
        except Exception as exc:  # a splitter plugin's own fault, reported against the file
            raise self.fail(f"the splitter failed: {type(exc).__name__}: {exc}", "splitter") from None
