"""A request's jobs: fqid strings on the wire, the tuples themselves in process (``wire.Fqids``).

A slice of a million subjobs names its jobs as tuples; the embedded transport takes them as they are, and only
the remote transport, encoding the request, makes strings of them.
"""

from __future__ import annotations

import gc

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


def test_a_definition_built_in_process_leaves_no_splitter_for_the_collector() -> None:
    """A job built from a definition refers to itself: its splitter (a copy of a million argument lists) is let go of
    with the definition taken, not left to the collector's next full pass."""
    from orchestrator import ArgSplitter, Backend, Executable, Job
    from orchestrator.api.embedded import built_spec

    given = Job(name="x", application=Executable("/bin/true"), splitter=ArgSplitter([["1"], ["2"]]),
                backend=Backend("sim")).spec()
    gc.collect()
    gc.disable()
    try:
        splitters = sum(isinstance(o, ArgSplitter) for o in gc.get_objects())
        spec = built_spec("x", given, None)
        assert sum(isinstance(o, ArgSplitter) for o in gc.get_objects()) == splitters
    finally:
        gc.enable()
    assert spec["splitter"] == given["splitter"] and spec["splitter"]["params"]["args"] == [["1"], ["2"]]
