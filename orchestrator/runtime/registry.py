"""Plugin discovery through entry points (``importlib.metadata``).

Groups: ``orchestrator.backends`` (drivers), ``orchestrator.splitters``,
``orchestrator.postprocessors`` (and the older ``orchestrator.mergers``),
``orchestrator.commands`` (CLI commands, read by the CLI). Splitters and
postprocessors are stored in a job's definition as
``{"plugin": name, "params": {...}}`` and rebuilt by name.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections import ChainMap
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

from ..core.errors import JobError
from ..core.splitters import Splitter
from ..plugin.contract import Driver
from ..plugin.postprocess import Notification, Postprocessor

BACKENDS = "orchestrator.backends"
SPLITTERS = "orchestrator.splitters"
POSTPROCESSORS = ("orchestrator.postprocessors", "orchestrator.mergers")


class Group(Mapping[str, Any]):
    """One entry-point group's plugins by name, each imported when first asked for.

    Opening a home that runs on ``sim`` need not import asyncssh for ``ssh`` (0.14 s): the names come
    from the installed distributions' metadata, a plugin's module only when it is used. The first of a
    name wins, as Python finds them; a plugin that fails to load is left out with a warning, never a
    crash of the orchestrator.
    """

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._points: dict[str, importlib.metadata.EntryPoint] = {}
        for ep in importlib.metadata.entry_points(group=namespace):
            self._points.setdefault(ep.name, ep)
        self._loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name in self._loaded:
            return self._loaded[name]
        ep = self._points[name]  # KeyError: no such plugin
        try:
            self._loaded[name] = ep.load()
        except Exception as exc:  # a broken plugin must not stop the others
            from ..plugin.logs import get_logger

            get_logger(component="plugins").warning("plugin failed to load", group=self.namespace, name=name,
                                                   error=f"{type(exc).__name__}: {exc}")
            del self._points[name]
            raise KeyError(name) from None
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._points))

    def __len__(self) -> int:
        return len(self._points)


@cache
def group(namespace: str) -> Group:
    """The plugins of one entry-point group (read afresh after :func:`refresh`)."""
    return Group(namespace)


def refresh() -> None:
    """Forget what was found (after installing a plugin in a running process)."""
    group.cache_clear()
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


def _postprocessors() -> Mapping[str, Any]:
    """Postprocessors by name; a name in the newer group wins over the older ``orchestrator.mergers``."""
    return ChainMap(*(group(namespace) for namespace in POSTPROCESSORS))  # type: ignore[arg-type]  # read only


def is_notification(data: Mapping[str, Any]) -> bool:
    """Whether a stored postprocessor is a notification (told of a master's end, or of its hold)."""
    cls = _postprocessors().get(str(data.get("plugin")))
    return isinstance(cls, type) and issubclass(cls, Notification)


def dump(obj: Splitter | Postprocessor | None) -> dict[str, Any] | None:
    if obj is None:
        return None
    return {"plugin": obj.name, "params": obj.params()}


def _load(known: Mapping[str, Any], data: dict[str, Any] | None, what: str) -> Any:
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
