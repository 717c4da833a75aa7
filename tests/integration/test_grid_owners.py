"""Work runs as its owner on the ``dask`` and ``glite`` backends (issue 22): a root service admits orch-alice;
her job, submitted through the command line as her, runs with her uid (``id -u`` in its stdout), though the dask
worker (and the emulated WMS) run as root.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from served import Service, cli_ok, start
from test_service_owners import _user, as_user

ALICE = "orch-alice"


@pytest.fixture
def team_home() -> Iterator[Path]:
    """A home other users may traverse (pytest's tmp_path is 0700), of a service that admits orch-alice."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser: the client and the runs are another OS user")
    _user(ALICE)
    path = Path(tempfile.mkdtemp(prefix="orch-grid-owners-"))
    path.chmod(0o755)
    home = path / "home"
    home.mkdir(mode=0o755)
    (home / "orchestrator.toml").write_text(f'[core]\npoll_interval = 0.1\n[service]\nusers = ["{ALICE}"]\n')
    yield home
    shutil.rmtree(path, ignore_errors=True)


def run_id_as_alice(home: Path, backend: str) -> dict[str, object]:
    """orch-alice submits ``id -u`` on ``backend`` (a TOML table's body) and waits; the job as ``show`` has it."""
    jobfile = home.parent / "id.toml"
    jobfile.write_text(f'name = "id"\n[application]\nexe = "/usr/bin/id"\nargs = ["-u"]\n[backend]\n{backend}')
    jobfile.chmod(0o644)
    done = as_user(ALICE, home, "submit", "--wait", "--timeout", "120", str(jobfile))
    assert done.returncode == 0, (done.stdout, done.stderr)
    shown: dict[str, object] = json.loads(cli_ok(home, "show", done.stdout.split()[0], "--json"))
    return shown


def test_a_dask_run_starts_as_its_owner(services: list[Service], team_home: Path) -> None:
    pytest.importorskip("distributed", reason="distributed (the dask extra) is not installed")
    start(services, team_home)
    shown = run_id_as_alice(team_home, 'name = "dask"\nworkers = 1\n')
    assert (shown["status"], shown["owner"]) == ("completed", ALICE), shown
    assert cli_ok(team_home, "peek", str(shown["fqid"])).strip() == str(pwd.getpwnam(ALICE).pw_uid)


def test_a_glite_node_runs_as_its_owner(services: list[Service], team_home: Path) -> None:
    from orch_glite.testing import WMSProcess

    wms = WMSProcess(team_home.parent / "wms").start()  # the emulated WMS, as root, as a site runs it
    try:
        start(services, team_home)
        shown = run_id_as_alice(team_home, f'name = "glite"\nendpoint = "{wms.endpoint}"\n')
        assert (shown["status"], shown["owner"]) == ("completed", ALICE), shown
        assert cli_ok(team_home, "peek", str(shown["fqid"])).strip() == str(pwd.getpwnam(ALICE).pw_uid)
        # Her wrappers told the WMS of their run in an events file of hers alone.
        mine = team_home.parent / "wms" / f"events-{ALICE}.log"
        assert mine.stat().st_uid == pwd.getpwnam(ALICE).pw_uid and mine.stat().st_mode & 0o077 == 0
        assert "END" in mine.read_text()
    finally:
        wms.stop()
        wms.kill_nodes()
