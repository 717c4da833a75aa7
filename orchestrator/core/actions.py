"""The action table: what to do about a run's end, by its cause (PanDA's reaction to a failure's cause).

Rules, in the settings' ``[[actions]]`` tables, are read in order; the first
whose conditions all hold for a run that did not succeed decides:

- conditions: ``backends`` (names), ``level`` and ``verdict`` (GBS's, one or
  a list), ``reason`` (a regular expression searched in the backend's or the
  analyser's reason, e.g. ``OUT_OF_MEMORY``), ``exit_codes`` (``[low, high]``),
  ``stderr`` (a regular expression searched in the last lines of stderr);
- action: ``retry``; ``more_memory`` / ``more_time`` (the backend setting
  ``mem`` / ``time`` times ``factor``, at most ``cap``); ``elsewhere`` (the
  backend settings in ``set``, e.g. another partition or host); ``hold`` (for
  a person); ``fail``.

A rule's retries are its own (``max`` per run), never the user's retry
limits: a fault of the infrastructure does not use up what the user allowed
for the application's own failures. Pure: the runtime applies the setting
changes a rule asks for (``AdjustRun``), since settings never enter the core.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

ACTIONS = ("retry", "more_memory", "more_time", "elsewhere", "hold", "fail")
RETRYING = frozenset({"retry", "more_memory", "more_time", "elsewhere"})
#: The backend setting each scaling action multiplies.
SETTING = {"more_memory": "mem", "more_time": "time"}
LEVELS = ("orchestrator", "backend", "batch", "worker", "application", "user")
VERDICTS = ("early", "late_handled", "late_unhandled", "failed", "hold")
KEYS = frozenset({"name", "backends", "level", "verdict", "reason", "exit_codes", "stderr", "action", "factor",
                  "cap", "set", "max"})


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the table (position: 1-based, as the user counts ``[[actions]]`` tables)."""

    position: int
    name: str
    action: str
    backends: tuple[str, ...] = ()
    levels: tuple[str, ...] = ()
    verdicts: tuple[str, ...] = ()
    reason: str | None = None
    exit_codes: tuple[int, int] | None = None
    stderr: str | None = None
    factor: float = 2.0
    cap: str | None = None
    settings: tuple[tuple[str, Any], ...] = ()
    max: int = 3

    @property
    def counter(self) -> str:
        """The key of ``info.counters`` that counts this rule's retries of a run."""
        return f"rule:{self.name}"

    def matches(self, backend: str, level: str, verdict: str, reason: str, exit_code: int | None,
                stderr: str | None) -> bool:
        if self.backends and backend not in self.backends:
            return False
        if self.levels and level not in self.levels:
            return False
        if self.verdicts and verdict not in self.verdicts:
            return False
        if self.reason is not None and not re.search(self.reason, reason):
            return False
        if self.exit_codes is not None and (exit_code is None or
                                            not self.exit_codes[0] <= exit_code <= self.exit_codes[1]):
            return False
        return self.stderr is None or (stderr is not None and re.search(self.stderr, stderr) is not None)

    def describe(self) -> str:
        """What the rule changes, for the failure history."""
        if self.action in SETTING:
            return f"{SETTING[self.action]} x{self.factor:g}" + (f" (at most {self.cap})" if self.cap else "")
        if self.action == "elsewhere":
            return ", ".join(f"{k}={v}" for k, v in self.settings)
        return self.action


def choose(rules: Sequence[Rule], backend: str, level: str, verdict: str, reason: str, exit_code: int | None,
           stderr: str | None) -> Rule | None:
    """The first rule that matches a run's end, or ``None``."""
    for rule in rules:
        if rule.matches(backend, level, verdict, reason, exit_code, stderr):
            return rule
    return None


def parse_rules(tables: Any, where: str = "actions") -> tuple[Rule, ...]:
    """The ``[[actions]]`` tables as rules; a malformed one is refused naming its position and field."""
    if not isinstance(tables, list):
        raise ConfigError(f"{where} must be a list of tables ([[actions]]), not {type(tables).__name__}")
    rules = []
    names: set[str] = set()
    for n, table in enumerate(tables, 1):
        rule = _rule(n, table, f"{where}[{n}]")
        if rule.name in names:
            raise ConfigError(f"{where}[{n}].name: {rule.name!r} is the name of an earlier rule")
        names.add(rule.name)
        rules.append(rule)
    return tuple(rules)


def _rule(n: int, table: Any, at: str) -> Rule:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{at}: a rule is a table, not {table!r}")
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise ConfigError(f"{at}.{unknown[0]}: unknown field (known: {', '.join(sorted(KEYS))})")
    action = table.get("action")
    if action not in ACTIONS:
        raise ConfigError(f"{at}.action: must be one of {', '.join(ACTIONS)}, not {action!r}")
    name = table.get("name", f"rule-{n}")
    if not isinstance(name, str) or not name or ":" in name:
        raise ConfigError(f"{at}.name: a non-empty name without ':', not {name!r}")
    factor = table.get("factor", 2.0)
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 1:
        raise ConfigError(f"{at}.factor: a number greater than 1, not {factor!r}")
    limit = table.get("max", 3)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise ConfigError(f"{at}.max: an integer >= 0 (the retries this rule may give one run), not {limit!r}")
    cap = table.get("cap")
    if cap is not None and (action not in SETTING or not isinstance(cap, (str, int))):
        raise ConfigError(f"{at}.cap: a limit for more_memory or more_time (such as '64G' or '2-00:00:00'), "
                          f"not {cap!r} for action {action!r}")
    if cap is not None:
        try:
            (megabytes if action == "more_memory" else minutes)(cap)
        except ValueError:
            raise ConfigError(f"{at}.cap: {cap!r} is not a {'memory size' if action == 'more_memory' else 'Slurm time'}"
                              ) from None
    settings = table.get("set", {})
    if not isinstance(settings, Mapping) or (action == "elsewhere") != bool(settings):
        raise ConfigError(f"{at}.set: the backend settings to change, a table given with action 'elsewhere' "
                          f"(and only with it), not {settings!r}")
    codes = table.get("exit_codes")
    if codes is not None and not (isinstance(codes, list) and len(codes) == 2 and
                                  all(isinstance(c, int) and not isinstance(c, bool) for c in codes)
                                  and codes[0] <= codes[1]):
        raise ConfigError(f"{at}.exit_codes: [low, high], two integers, not {codes!r}")
    return Rule(position=n, name=name, action=action, backends=_names(table, "backends", at, None),
                levels=_names(table, "level", at, LEVELS), verdicts=_names(table, "verdict", at, VERDICTS),
                reason=_pattern(table, "reason", at), exit_codes=(codes[0], codes[1]) if codes else None,
                stderr=_pattern(table, "stderr", at), factor=float(factor),
                cap=str(cap) if cap is not None else None, settings=tuple(sorted(settings.items())), max=limit)


def _names(table: Mapping[str, Any], key: str, at: str, allowed: Sequence[str] | None) -> tuple[str, ...]:
    value = table.get(key, [])
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ConfigError(f"{at}.{key}: a name or a list of names, not {value!r}")
    if allowed is not None:
        wrong = [v for v in values if v not in allowed]
        if wrong:
            raise ConfigError(f"{at}.{key}: {wrong[0]!r} is not one of {', '.join(allowed)}")
    return tuple(values)


def _pattern(table: Mapping[str, Any], key: str, at: str) -> str | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{at}.{key}: a regular expression, not {value!r}")
    try:
        re.compile(value)
    except re.error as exc:
        raise ConfigError(f"{at}.{key}: {value!r} is not a regular expression: {exc}") from None
    return value


#: What a scaling action starts from when the job set no value (the backend's own default is unknown here).
UNSET_BASE = {"mem": "1024M", "time": "60"}
_MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def megabytes(value: str | int) -> float:
    """Slurm's memory sizes: megabytes, or a number with K, M, G or T."""
    text = str(value).strip().upper()
    unit = text[-1] if text and text[-1] in _MEM_UNITS else "M"
    number = text[:-1] if text and text[-1] in _MEM_UNITS else text
    return float(number) * _MEM_UNITS[unit]


def minutes(value: str | int) -> float:
    """Slurm's time limits: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``."""
    text = str(value).strip()
    m = _TIME.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a Slurm time")
    days, a, b, c = m.group(1), int(m.group(2)), m.group(3), m.group(4)
    if days is not None:  # D-H[:M[:S]]
        return int(days) * 1440 + a * 60 + int(b or 0) + int(c or 0) / 60
    if c is not None:  # H:M:S
        return a * 60 + int(b or 0) + int(c) / 60
    if b is not None:  # M:S
        return a + int(b) / 60
    return float(a)


def scaled(setting: str, value: str | int | None, factor: float, cap: str | None) -> str:
    """The new value of ``mem`` or ``time``: ``value`` (or its unset base) times ``factor``, at most ``cap``."""
    base = UNSET_BASE[setting] if value is None else value
    if setting == "mem":
        mb = megabytes(base) * factor
        if cap is not None:
            mb = min(mb, megabytes(cap))
        return f"{max(1, round(mb))}M"
    mins = minutes(base) * factor
    if cap is not None:
        mins = min(mins, minutes(cap))
    return str(max(1, round(mins)))
