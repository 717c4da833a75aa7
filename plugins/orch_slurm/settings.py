"""``Backend("slurm", ...)`` settings: checked once, at ``add()``, and turned into ``sbatch`` options.

Checking here (not at ``sbatch`` time) is what makes a typo in a time limit
or a relative ``slurm_conf`` a :class:`SettingsError` naming the field when
the job is added, instead of a whole array refused later. The normalised
settings are plain JSON values (the repository stores them with the job),
and every value that reaches ``sbatch`` is one argument of an argument
list, never a piece of a shell string.

A splitter may vary the resources per subjob (``GenericSplitter(
multi_attrs={"backend.time": [...]})``); :func:`resources_key` is what
runs must share to go into one job array.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.plugin import SettingsError

FIELDS = ("via", "host", "partition", "time", "mem", "cpus", "account", "qos", "sbatch_args", "slurm_conf")
#: Options the driver sets itself: ``sbatch_args`` may not override them.
RESERVED = ("--array", "-a", "--job-name", "-J", "--comment", "--output", "-o", "--error", "-e", "--parsable",
            "--chdir", "-D", "--wrap", "--no-requeue", "--requeue")
_TOKEN = re.compile(r"^[A-Za-z0-9_.,:+-]+$")
_TIME = re.compile(r"^(?:\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}"
                   r"|UNLIMITED|INFINITE|unlimited|infinite)$")
_MEM = re.compile(r"^\d+[KMGT]?$")


def _token(field: str, value: Any, what: str) -> str:
    if not isinstance(value, str) or not _TOKEN.match(value):
        raise SettingsError(field, f"{field} must be {what}, not {value!r}")
    return value


def validate(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``Backend("slurm", **settings)``; return them normalised, or raise :class:`SettingsError`."""
    for name in settings:
        if name not in FIELDS:
            raise SettingsError(name, f"backend 'slurm' takes no setting {name!r} (it takes {', '.join(FIELDS)})")
    out: dict[str, Any] = {}
    via = settings.get("via", "local")
    if via == "ssh":
        # Honest refusal: over SSH the run files, inputs and outputs would have to be staged to the cluster's
        # file system and fetched back before a run is judged, as the ssh backend does; not built yet.
        raise SettingsError("via", "via='ssh' is not supported yet: run the orchestrator on a login node whose "
                                   "file system the compute nodes share, with via='local' (the default)")
    if via != "local":
        raise SettingsError("via", f"via must be 'local' (or, later, 'ssh'), not {via!r}")
    if "host" in settings:
        raise SettingsError("host", "host is only for via='ssh', which is not supported yet")
    if "partition" in settings:
        out["partition"] = _token("partition", settings["partition"], "a partition name (or a comma-separated list)")
    if "time" in settings:
        t = settings["time"]
        if isinstance(t, bool) or not isinstance(t, (int, str)) or (isinstance(t, int) and t < 1) or (
                isinstance(t, str) and not _TIME.match(t)):
            raise SettingsError("time", f"time must be minutes (an int >= 1) or a Slurm time such as '30', "
                                        f"'1:30:00', '2-12' (whole minutes: Slurm rounds seconds up), not {t!r}")
        out["time"] = str(t)
    if "mem" in settings:
        m = settings["mem"]
        if isinstance(m, bool) or not isinstance(m, (int, str)) or (isinstance(m, int) and m < 1) or (
                isinstance(m, str) and not _MEM.match(m)):
            raise SettingsError("mem", f"mem must be megabytes (an int) or a size such as '500M', '4G', not {m!r}")
        out["mem"] = str(m)
    if "cpus" in settings:
        c = settings["cpus"]
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise SettingsError("cpus", f"cpus must be an integer >= 1 (CPUs per subjob), not {c!r}")
        out["cpus"] = c
    for name in ("account", "qos"):
        if name in settings:
            out[name] = _token(name, settings[name], f"a Slurm {name} name")
    if "sbatch_args" in settings:
        out["sbatch_args"] = _extra(settings["sbatch_args"])
    if "slurm_conf" in settings:
        conf = settings["slurm_conf"]
        if not isinstance(conf, str) or not os.path.isabs(conf) or not os.path.isfile(conf):
            raise SettingsError("slurm_conf", f"slurm_conf must be the absolute path of a slurm.conf, not {conf!r}")
        out["slurm_conf"] = os.path.normpath(conf)
    return out


def _extra(value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(a, str) for a in value):
        raise SettingsError("sbatch_args", "sbatch_args must be a list of strings such as ['--constraint=avx2']")
    for arg in value:
        if not arg.startswith("-") or "\n" in arg or "\0" in arg:
            raise SettingsError("sbatch_args", f"sbatch_args: {arg!r} is not an option (each starts with '-')")
        name = arg.split("=", 1)[0]
        if name in RESERVED or any(name.startswith(r) and len(r) == 2 for r in RESERVED):
            raise SettingsError("sbatch_args", f"sbatch_args: {name} is set by the driver itself")
    return list(value)


def resources_key(settings: Mapping[str, Any]) -> tuple[Any, ...]:
    """What runs must share to go into one job array (one ``sbatch``) on one cluster."""
    return (settings.get("slurm_conf"), *sbatch_options(settings))


def sbatch_options(settings: Mapping[str, Any]) -> list[str]:
    """The per-job resource options for ``sbatch``, from normalised settings."""
    opts: list[str] = []
    for name, flag in (("partition", "--partition"), ("time", "--time"), ("mem", "--mem"),
                       ("cpus", "--cpus-per-task"), ("account", "--account"), ("qos", "--qos")):
        if name in settings:
            opts.append(f"{flag}={settings[name]}")
    extra: Sequence[str] = settings.get("sbatch_args", ())
    opts += list(extra)
    return opts
