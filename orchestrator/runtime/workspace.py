"""Where a job's files live under the home.

``workspace/<id>/input`` (shared, configured once for a master),
``workspace/<id>/output`` (merged output), and per subjob
``workspace/<id>/<i>/input``, ``.../output`` and ``.../work`` (the working
directory the wrapper runs in). A job without subjobs uses
``workspace/<id>/{input,output,work}`` itself.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..core.ids import FQID


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = root

    def jobdir(self, fqid: FQID) -> Path:
        return self.root.joinpath(*(str(p) for p in fqid))

    def inputdir(self, fqid: FQID) -> Path:
        return self.jobdir(fqid) / "input"

    def outputdir(self, fqid: FQID) -> Path:
        return self.jobdir(fqid) / "output"

    def workdir(self, fqid: FQID) -> Path:
        return self.jobdir(fqid) / "work"

    def remove(self, fqid: FQID) -> None:
        shutil.rmtree(self.jobdir(fqid), ignore_errors=True)
