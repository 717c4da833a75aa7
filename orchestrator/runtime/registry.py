"""Plugin discovery through entry points, with stevedore.

Groups: ``orchestrator.backends`` (drivers), ``orchestrator.splitters``,
``orchestrator.postprocessors`` (and the older ``orchestrator.mergers``),
``orchestrator.commands`` (CLI commands, read by the CLI). Splitters and
postprocessors are stored in a job's definition as
``{"plugin": name, "params": {...}}`` and rebuilt by name.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from stevedore import ExtensionManager

from ..core.errors import JobError
from ..core.splitters import Splitter
from ..plugin.contract import Driver
from ..plugin.postprocess import Postprocessor

BACKENDS = "orchestrator.backends"
SPLITTERS = "orchestrator.splitters"
POSTPROCESSORS = ("orchestrator.postprocessors", "orchestrator.mergers")


@cache
def group(namespace: str) -> dict[str, Any]:
    manager: ExtensionManager[Any] = ExtensionManager(namespace=namespace, invoke_on_load=False)
    return {ext.name: ext.plugin for ext in manager}


def refresh() -> None:
    """Forget what was found (after installing a plugin in a running process)."""
    group.cache_clear()
    ExtensionManager.ENTRY_POINT_CACHE.clear()
    importlib.invalidate_caches()


def backend_names() -> list[str]:
    return sorted(group(BACKENDS))


def driver_class(name: str) -> type[Driver]:
    plugin = group(BACKENDS).get(name)
    if plugin is None:
        known = ", ".join(backend_names()) or "none"
        raise KeyError(f"unknown backend {name!r} (installed: {known})")
    if not (isinstance(plugin, type) and issubclass(plugin, Driver)):
        raise KeyError(f"backend {name!r} does not name a Driver subclass")
    try:
        plugin.check_implemented()
    except TypeError as exc:
        raise KeyError(f"backend {name!r}: {exc}") from None
    return plugin


def _postprocessors() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for namespace in reversed(POSTPROCESSORS):
        out.update(group(namespace))
    return out


def dump(obj: Splitter | Postprocessor | None) -> dict[str, Any] | None:
    if obj is None:
        return None
    return {"plugin": obj.name, "params": obj.params()}


def _load(known: dict[str, Any], data: dict[str, Any] | None, what: str) -> Any:
    if data is None:
        return None
    cls = known.get(data["plugin"])
    if cls is None:
        raise JobError(f"unknown {what} {data['plugin']!r} (installed: {', '.join(sorted(known))})", field=what)
    return cls(**data.get("params", {}))


def load_splitter(data: dict[str, Any] | None) -> Splitter | None:
    result: Splitter | None = _load(group(SPLITTERS), data, "splitter")
    return result


def load_postprocessor(data: dict[str, Any] | None) -> Postprocessor | None:
    result: Postprocessor | None = _load(_postprocessors(), data, "postprocessor")
    return result


def splitter_class(name: str) -> type[Splitter]:
    cls = group(SPLITTERS).get(name)
    if cls is None:
        raise KeyError(f"unknown splitter {name!r} (installed: {', '.join(sorted(group(SPLITTERS)))})")
    return cls  # type: ignore[no-any-return]


def postprocessor_class(name: str) -> type[Postprocessor]:
    cls = _postprocessors().get(name)
    if cls is None:
        raise KeyError(f"unknown postprocessor {name!r} (installed: {', '.join(sorted(_postprocessors()))})")
    return cls  # type: ignore[no-any-return]
