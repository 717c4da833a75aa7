"""A job's definition: the fields a user sets on ``Job(...)``, and their stored form (``spec``).

The stored form is plain JSON: the application, files, backend and retry
policy as dicts, splitter and postprocessors as ``{"plugin": name,
"params": {...}}``, a pre-job or aggregator as ``{"name", "spec"}``. It is
what the repository keeps, what the runtime builds runs from, and what a
service receives; a copy of a job is a new job made from it, so the twin
shares no object with the original.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from ..core.model import Backend, Executable, RetryPolicy
from ..core.splitters import DEFERRED, Splitter, is_deferred
from ..plugin.postprocess import Postprocessor
from ..runtime import registry

#: Fields of ``Job(...)`` that are part of its definition, in the order ``repr`` shows them.
FIELDS = ("name", "application", "inputfiles", "outputfiles", "splitter", "postprocessors", "backend", "retry",
          "mode", "steps", "step_weights", "prejob", "aggregator", "min_success", "comment", "metadata",
          "fail_on_missing_output")


#: What belongs to a master alone: a subjob (and a copy of one) has none of it.
MASTER_ONLY = ("splitter", "merger", "postprocessors", "prejob", "aggregator", "min_success", "comment", "metadata")


def without_splitter(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with its splitter's parameters left out (:data:`DEFERRED`)."""
    splitter = spec.get("splitter")
    if not splitter or is_deferred(splitter):
        return spec
    return {**spec, "splitter": {"plugin": splitter.get("plugin"), DEFERRED: True}}


def subjob_part(spec: dict[str, Any]) -> dict[str, Any]:
    """The part of a master's definition its subjobs inherit."""
    return {k: v for k, v in spec.items() if k not in MASTER_ONLY}


class Definition:
    """The definition fields of a job (the base of :class:`~.job.Job`)."""

    def __init__(
        self,
        name: str = "",
        application: Executable | None = None,
        inputfiles: Sequence[str] = (),
        outputfiles: Sequence[str] = (),
        splitter: Splitter | None = None,
        merger: Postprocessor | None = None,
        backend: str | Backend = "local",
        retry: RetryPolicy | None = None,
        mode: str = "production",
        steps: str | Sequence[str | int] | None = None,
        step_weights: Sequence[float] | None = None,
        prejob: Definition | None = None,
        aggregator: Definition | None = None,
        min_success: float = 1.0,
        postprocessors: Sequence[Postprocessor] = (),
        comment: str = "",
        metadata: dict[str, Any] | None = None,
        fail_on_missing_output: bool | None = None,
    ) -> None:
        self.name = name
        self.application = application
        self.inputfiles = list(inputfiles)
        self.outputfiles = list(outputfiles)
        self._splitter_data: dict[str, Any] | None = None
        self.splitter = splitter
        #: ``merger=`` is a shorthand for one merger that runs first of the postprocessors.
        self.merger = merger
        self.postprocessors = list(postprocessors)
        self.backend: Backend = backend if isinstance(backend, Backend) else Backend(backend)
        self.retry = retry or RetryPolicy()
        self.mode = mode
        #: DataGrid's JobSteps: ``"1..1000000"`` or a list of labels; each run's State steps through them.
        self.steps: str | list[Any] | None = steps if steps is None or isinstance(steps, str) else list(steps)
        self.step_weights: list[float] | None = list(step_weights) if step_weights is not None else None
        self._prejob = prejob
        self._aggregator = aggregator
        #: The fraction of subjobs that must reach a final state for the aggregator to start.
        self.min_success = min_success
        self._comment = comment
        self._metadata: dict[str, Any] = dict(metadata or {})
        #: A run whose declared output files matched nothing fails (``None``: the home's setting).
        self.fail_on_missing_output = fail_on_missing_output

    # ------------------------------------------------------------ the stored form
    def spec(self) -> dict[str, Any]:
        """What the repository stores of the definition (a fresh dict: it shares nothing with the job)."""
        spec: dict[str, Any] = {
            "application": self.application.to_dict() if self.application else None,
            "inputfiles": list(self.inputfiles),
            "outputfiles": list(self.outputfiles),
            "backend": self.backend.to_dict(),
            "retry": self.retry.to_dict(),
            "mode": self.mode,
            "splitter": registry.dump(self.splitter),
            "merger": registry.dump(self.merger),
        }
        if self.postprocessors:
            spec["postprocessors"] = [registry.dump(p) for p in self.postprocessors]
        if self.steps is not None:
            spec["steps"] = self.steps if isinstance(self.steps, str) else list(self.steps)
        if self.step_weights is not None:
            spec["step_weights"] = list(self.step_weights)
        for role, job in (("prejob", self._prejob), ("aggregator", self._aggregator)):
            if job is not None:
                spec[role] = {"name": job.name, "spec": job.spec()}
        if self.min_success != 1.0:
            spec["min_success"] = self.min_success
        if self._comment:
            spec["comment"] = self._comment
        if self._metadata:
            spec["metadata"] = copy.deepcopy(self._metadata)
        if self.fail_on_missing_output is not None:
            spec["fail_on_missing_output"] = self.fail_on_missing_output
        return spec

    def load(self, name: str, spec: dict[str, Any]) -> None:
        """Set every field from a stored definition."""
        app = spec.get("application")
        self.name = name
        self.application = Executable.from_dict(app) if app else None
        self.inputfiles = list(spec.get("inputfiles", []))
        self.outputfiles = list(spec.get("outputfiles", []))
        self.splitter = None
        self._splitter_data = spec.get("splitter")  # built when first read: a listing of masters needs none
        self.merger = registry.load_postprocessor(spec.get("merger"))
        self.postprocessors = [p for p in (registry.load_postprocessor(d) for d in spec.get("postprocessors", []))
                               if p is not None]
        self.backend = Backend.from_dict(spec["backend"])
        self.retry = RetryPolicy.from_dict(spec.get("retry"))
        self.mode = spec.get("mode", "production")
        self.steps = spec.get("steps")
        self.step_weights = spec.get("step_weights")
        self._prejob = Definition.of(spec["prejob"]["name"], spec["prejob"]["spec"]) if spec.get("prejob") else None
        self._aggregator = (Definition.of(spec["aggregator"]["name"], spec["aggregator"]["spec"])
                            if spec.get("aggregator") else None)
        self.min_success = spec.get("min_success", 1.0)
        self._comment = spec.get("comment", "")
        self._metadata = dict(spec.get("metadata", {}))
        self.fail_on_missing_output = spec.get("fail_on_missing_output")

    @property
    def comment(self) -> str:
        return self._comment

    @property
    def metadata(self) -> dict[str, Any]:
        return self._metadata

    @property
    def splitter(self) -> Splitter | None:
        """How a master splits into subjobs; a stored one is built from its definition when first read."""
        if self._splitter_data is not None:
            data: dict[str, Any] | None = self._splitter_data
            if is_deferred(data):
                data = self._stored_splitter()
            self._splitter_data = None
            self._splitter = registry.load_splitter(data)
        return self._splitter

    @splitter.setter
    def splitter(self, value: Splitter | None) -> None:
        self._splitter, self._splitter_data = value, None

    def _stored_splitter(self) -> dict[str, Any] | None:
        """The stored splitter's definition, when a service sent the job without it (a job reads it)."""
        raise NotImplementedError

    @classmethod
    def of(cls, name: str, spec: dict[str, Any]) -> Definition:
        out = cls.__new__(cls)
        Definition.__init__(out)
        out.load(name, spec)
        return out
