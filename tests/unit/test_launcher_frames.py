"""The launcher's messages (``orch_local.launcher``): frames of NUL-joined fields, read whole or not at all."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from orch_local.launcher import frame, frames

fields = st.lists(st.binary().filter(lambda b: b"\0" not in b), min_size=1, max_size=6)


@given(st.lists(fields, max_size=5), st.integers(min_value=1, max_value=64))
def test_messages_come_back_whole_however_the_bytes_arrive(messages: list[list[bytes]], step: int) -> None:
    data = b"".join(frame(*m) for m in messages)
    inbox = bytearray()
    got: list[list[bytes]] = []
    for at in range(0, len(data), step):  # the bytes in pieces, as a socket gives them
        inbox += data[at:at + step]
        got += frames(inbox)
    assert got == messages and not inbox


def test_a_partial_frame_waits_for_its_rest() -> None:
    data = frame(b"S", b"key", b"") + frame(b"E", b"key")
    inbox = bytearray(data[:-2])
    assert frames(inbox) == [[b"S", b"key", b""]]
    inbox += data[-2:]
    assert frames(inbox) == [[b"E", b"key"]] and not inbox
