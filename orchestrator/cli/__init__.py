"""The ``orchestrator`` command line (click): written once over the API, embedded or through a service."""

from .commands import add_plugin_commands, cli


def main() -> None:
    cli(prog_name="orchestrator")


add_plugin_commands()


__all__ = ["cli", "main"]
