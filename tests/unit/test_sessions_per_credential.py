"""The status page's sessions: one credential (a user's token) keeps at most 20, its oldest going first, so a
user who logs in a thousand times pushes no other user's session out of the 1,000 kept."""

from __future__ import annotations

from pathlib import Path

from orchestrator.service.sessions import MAX_PER_CREDENTIAL, MAX_SESSIONS, Sessions, digest


def test_one_credential_keeps_its_newest_twenty_and_pushes_out_no_one_else(tmp_path: Path) -> None:
    sessions = Sessions(tmp_path / "sessions", lifetime=3600)
    theirs, _ = sessions.open(digest("nobody's token"))
    mine = [sessions.open(digest("bin's token"))[0] for _ in range(MAX_SESSIONS + 5)]
    assert sessions.find(theirs) is not None
    assert [sessions.find(sid) is not None for sid in mine[-MAX_PER_CREDENTIAL:]] == [True] * MAX_PER_CREDENTIAL
    assert sessions.find(mine[-MAX_PER_CREDENTIAL - 1]) is None
    reopened = Sessions(tmp_path / "sessions", lifetime=3600)  # as a restarted service reads them
    assert reopened.find(theirs) is not None and reopened.find(mine[-1]) is not None
