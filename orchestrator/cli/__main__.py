"""``python -m orchestrator.cli``: the ``orchestrator`` command (how a watcher is started, by this interpreter)."""

from . import main

main()
