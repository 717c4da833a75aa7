"""orchestrator: an asynchronous, event-driven job orchestrator for batch and grid computing."""

from .drivers import (
    Capabilities,
    Driver,
    DriverContext,
    RunHandle,
    RunSpec,
    SettingsError,
    StatusUpdate,
    SubmitError,
    SubmitOutcome,
)
from .errors import ConfigError, HomeLockedError, JobError, OrchestratorError
from .job import Job, JobSlice, SubjobList
from .mergers import Merger, TextMerger
from .model import Backend, Executable, JobInfo, RetryPolicy
from .orchestrator import Orchestrator
from .splitters import ArgSplitter, FileSplitter, GenericSplitter, Splitter, StepSplitter
from .status import JobStatus

__version__ = "0.1.0"

__all__ = [
    "ArgSplitter", "Backend", "Capabilities", "ConfigError", "Driver", "DriverContext", "Executable",
    "FileSplitter", "GenericSplitter", "HomeLockedError", "Job", "JobError", "JobInfo", "JobSlice",
    "JobStatus", "Merger", "Orchestrator", "OrchestratorError", "RetryPolicy", "RunHandle", "RunSpec",
    "SettingsError", "Splitter", "StepSplitter", "StatusUpdate", "SubjobList", "SubmitError", "SubmitOutcome",
    "TextMerger",
]
