"""The SDK for backend plugins: the only part of ``orchestrator`` a plugin imports.

A plugin implements :class:`Driver` (see :mod:`.contract`), declares its
:class:`Capabilities` and its :class:`Settings` dataclass, and registers it
under the entry-point group ``orchestrator.backends``. ``docs/plugins.md`` is
the guide; ``plugins/`` holds the built-in backends, written against this
SDK exactly as a third party would.
"""

from ..core.statuses import JobStatus
from .contract import (
    Capabilities,
    Driver,
    DriverContext,
    RunHandle,
    RunSpec,
    StatusUpdate,
    SubmitError,
    SubmitOutcome,
)
from .settings import NoSettings, Settings, SettingsError

__all__ = ["Capabilities", "Driver", "DriverContext", "JobStatus", "NoSettings", "RunHandle", "RunSpec", "Settings",
           "SettingsError", "StatusUpdate", "SubmitError", "SubmitOutcome"]
