"""The ``orchestrator`` command line (click): written once over the API, embedded or through a service."""

from . import acting as _acting  # noqa: F401  (registers kill, resubmit, release, remove, force-status)
from . import story as _story  # noqa: F401  (registers story)
from .commands import cli


def main() -> None:
    cli(prog_name="orchestrator")


__all__ = ["cli", "main"]
