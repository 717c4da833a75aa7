"""The cyclic garbage collector, paused while a bulk step makes many objects that live only as long as the step.

A million-run submission makes its ``RunSpec``\\ s a chunk at a time; they
are freed by reference counting once the chunk is answered. While they are
alive they are young objects surviving collections, so the collector
promotes them and then walks the whole heap again and again (a user's
million argument lists included) to find nothing: half the time of a chunk
went there. Paused for the step, the collector never sees them. Pauses nest
(two backends submitting at once) and a collector the user turned off stays
off.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_depth = 0
_resume = False


@contextmanager
def paused() -> Iterator[None]:
    """No automatic collection inside; the collector as it was afterwards."""
    global _depth, _resume
    if _depth == 0:
        _resume = gc.isenabled()
        gc.disable()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _resume:
            gc.enable()
