"""Fully qualified job ids: ``(3, 1)`` is subjob 1 of job 3, written ``"3.1"``."""

from __future__ import annotations

FQID = tuple[int, ...]


def parse_fqid(value: int | str | tuple[int, ...] | list[int]) -> FQID:
    """``3``, ``"3.1"``, ``(3, 1)`` or ``[3, 1]`` as a tuple; ``ValueError`` otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"not a job id: {value!r}")
    if isinstance(value, int):
        parts: tuple[int, ...] = (value,)
    elif isinstance(value, str):
        try:
            parts = tuple(int(p) for p in value.strip().split("."))
        except ValueError:
            raise ValueError(f"not a job id: {value!r} (expected e.g. '3' or '3.1')") from None
    elif isinstance(value, (tuple, list)):
        if not all(isinstance(p, int) and not isinstance(p, bool) for p in value):
            raise ValueError(f"not a job id: {value!r}")
        parts = tuple(value)
    else:
        raise ValueError(f"not a job id: {value!r}")
    if not parts or any(p < 0 for p in parts):
        raise ValueError(f"not a job id: {value!r}")
    return parts


def fqid_str(fqid: FQID) -> str:
    return ".".join(str(p) for p in fqid)


def parse_fqid_or_none(value: object) -> FQID | None:
    """A backend's fqid string as a tuple, or ``None`` when it is not one (never raises)."""
    if not isinstance(value, str):
        return None
    try:
        fq = tuple(int(p) for p in value.split("."))
    except ValueError:
        return None
    return fq if fq and all(p >= 0 for p in fq) else None
