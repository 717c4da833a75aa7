"""Reading a user's TOML file (a job file, a workflow file) with one-line errors that name it.

Job files and workflow files fail in the same three ways before their own
checks start (unreadable, not UTF-8, not TOML); each kind reports them
through its own error class, whose message names the kind of file.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_toml(path: Path, error: Callable[[Path, str], Exception]) -> dict[str, Any]:
    """Parse the TOML file at ``path``; a problem raises ``error(path, message)`` (without the parser's traceback)."""
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise error(path, f"cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(path, f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(path, f"TOML syntax error: {exc}") from None
