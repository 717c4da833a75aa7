"""Plugin discovery through entry points, with stevedore.

Three groups: ``orchestrator.backends`` (drivers), ``orchestrator.splitters``
and ``orchestrator.mergers``. Splitters and mergers are stored in the
repository as ``{"plugin": name, "params": {...}}`` and rebuilt by name.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

import stevedore
from stevedore import ExtensionManager

from .drivers import Driver
from .errors import JobError
from .mergers import Merger
from .splitters import Splitter

BACKENDS = "orchestrator.backends"
SPLITTERS = "orchestrator.splitters"
MERGERS = "orchestrator.mergers"


@cache
def _group(namespace: str) -> dict[str, Any]:
    manager: ExtensionManager[Any] = ExtensionManager(namespace=namespace, invoke_on_load=False)
    return {ext.name: ext.plugin for ext in manager}


def refresh() -> None:
    """Forget what was found (after installing a plugin in a running process).

    stevedore keeps its own caches of entry points, per namespace and per
    ``sys.path``; both are cleared too, or a new plugin stays invisible.
    """
    _group.cache_clear()
    ExtensionManager.ENTRY_POINT_CACHE.clear()
    internal = getattr(getattr(getattr(stevedore, "_cache", None), "_c", None), "_internal", None)
    if isinstance(internal, dict):
        internal.clear()
    importlib.invalidate_caches()


def backend_names() -> list[str]:
    return sorted(_group(BACKENDS))


def driver_class(name: str) -> type[Driver]:
    plugin = _group(BACKENDS).get(name)
    if plugin is None:
        known = ", ".join(backend_names()) or "none"
        raise KeyError(f"unknown backend {name!r} (installed: {known})")
    if not (isinstance(plugin, type) and issubclass(plugin, Driver)):
        raise KeyError(f"backend {name!r} does not name a Driver subclass")
    return plugin


def dump_plugin(obj: Splitter | Merger | None) -> dict[str, Any] | None:
    if obj is None:
        return None
    return {"plugin": obj.name, "params": obj.params()}


def _load(namespace: str, data: dict[str, Any] | None, what: str) -> Any:
    if data is None:
        return None
    cls = _group(namespace).get(data["plugin"])
    if cls is None:
        raise JobError(f"unknown {what} {data['plugin']!r} (installed: {', '.join(sorted(_group(namespace)))})",
                       field=what)
    return cls(**data.get("params", {}))


def load_splitter(data: dict[str, Any] | None) -> Splitter | None:
    result: Splitter | None = _load(SPLITTERS, data, "splitter")
    return result


def load_merger(data: dict[str, Any] | None) -> Merger | None:
    result: Merger | None = _load(MERGERS, data, "merger")
    return result


def splitter_class(name: str) -> type[Splitter]:
    cls = _group(SPLITTERS).get(name)
    if cls is None:
        raise KeyError(f"unknown splitter {name!r} (installed: {', '.join(sorted(_group(SPLITTERS)))})")
    return cls  # type: ignore[no-any-return]


def merger_class(name: str) -> type[Merger]:
    cls = _group(MERGERS).get(name)
    if cls is None:
        raise KeyError(f"unknown merger {name!r} (installed: {', '.join(sorted(_group(MERGERS)))})")
    return cls  # type: ignore[no-any-return]
