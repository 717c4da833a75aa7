"""A request's jobs: fqid strings on the wire, the tuples themselves in process (``wire.Fqids``).

A slice of a million subjobs names its jobs as tuples; the embedded transport takes them as they are, and only
the remote transport, encoding the request, makes strings of them.
"""

from __future__ import annotations

from orchestrator.api import wire


def test_targets_encode_as_fqid_strings_and_decode_back_to_the_same_jobs() -> None:
    tuples = [(3,), (4, 1), (4, 12)]
    request = wire.KillRequest(targets=wire.Fqids(tuples), keep_going=True)
    body = wire.encode(request)
    assert body == b'{"targets":["3","4.1","4.12"],"keep_going":true}'
    decoded = wire.decode("kill", body)
    assert isinstance(decoded, wire.KillRequest)
    assert decoded.targets == ["3", "4.1", "4.12"]
    assert list(wire.fqs(decoded.targets)) == tuples


def test_in_process_targets_are_the_tuples_given_not_a_copy() -> None:
    tuples = [(7, i) for i in range(1000)]
    named = wire.Fqids(tuples)
    assert wire.fqs(named) is tuples
    assert len(named) == 1000 and named[2] == "7.2" and list(named[:2]) == ["7.0", "7.1"]
    assert wire.fqs(None) == ()
