"""orchestrator: an asynchronous, event-driven job orchestrator for batch and grid computing."""

from .api.client import ServiceUnavailable
from .api.job import Job, SubjobList
from .api.orchestrator import Orchestrator
from .api.slices import JobSlice
from .core.errors import (
    ConfigError,
    HomeLockedError,
    JobError,
    Lagging,
    NotOwnerError,
    OrchestratorError,
    RepositoryError,
    RepositoryHeldError,
    WaitTimeout,
)
from .core.model import Backend, Executable, JobInfo, RetryPolicy
from .core.splitters import ArgSplitter, FileSplitter, GenericSplitter, Splitter
from .core.statuses import JobStatus
from .features.notifier import Notifier
from .features.partitioning import StepSplitter
from .features.postprocessors import CustomChecker, CustomMerger, FileChecker, TextMerger
from .plugin.contract import Capabilities, Driver, RunHandle, RunSpec, StatusUpdate, SubmitError
from .plugin.postprocess import Merger, Postprocessor
from .plugin.settings import Settings, SettingsError
from .runtime import registry as plugins  # what is installed: plugins.backend_names(), plugins.refresh()

__version__ = "0.2.0"

__all__ = [
    "ArgSplitter", "Backend", "Capabilities", "ConfigError", "CustomChecker", "CustomMerger", "Driver", "Executable",
    "FileChecker", "FileSplitter", "GenericSplitter", "HomeLockedError", "Job", "JobError", "JobInfo", "JobSlice",
    "JobStatus", "Lagging", "Merger", "NotOwnerError", "Notifier", "Orchestrator", "OrchestratorError",
    "Postprocessor", "RepositoryError", "RepositoryHeldError", "RetryPolicy", "RunHandle", "RunSpec",
    "ServiceUnavailable", "Settings", "SettingsError", "plugins", "Splitter", "StatusUpdate", "StepSplitter",
    "SubjobList", "SubmitError", "TextMerger", "WaitTimeout",
]
