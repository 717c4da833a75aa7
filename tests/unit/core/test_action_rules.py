"""The action table's rules read exactly: every field of a parsed rule, every refusal's whole message, and
Slurm's memory and time units."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.actions import Rule, megabytes, minutes, parse_rules, scaled
from orchestrator.core.errors import ConfigError

KNOWN = "action, backends, cap, exit_codes, factor, level, max, name, reason, set, stderr, verdict"


def test_a_rule_with_every_field() -> None:
    (rule,) = parse_rules([{"name": "oom", "backends": "slurm", "level": ["worker", "batch"], "verdict": "early",
                            "reason": "OOM", "exit_codes": [1, 9], "stderr": "killed", "action": "more_memory",
                            "factor": 3, "cap": 4096, "max": 0}])
    assert rule == Rule(position=1, name="oom", action="more_memory", backends=("slurm",),
                        levels=("worker", "batch"), verdicts=("early",), reason="OOM", exit_codes=(1, 9),
                        stderr="killed", factor=3.0, cap="4096", settings=(), max=0)
    assert isinstance(rule.factor, float)


def test_a_rule_with_defaults() -> None:
    first, second = parse_rules([{"action": "retry"}, {"action": "elsewhere", "set": {"q": "b", "p": "a"}}],
                                where="settings.actions")
    assert first == Rule(position=1, name="rule-1", action="retry", backends=(), levels=(), verdicts=(),
                         reason=None, exit_codes=None, stderr=None, factor=2.0, cap=None, settings=(), max=3)
    assert second.name == "rule-2" and second.settings == (("p", "a"), ("q", "b"))
    assert second.describe() == "p=a, q=b"
    assert first.describe() == "retry"
    assert parse_rules([]) == ()


def test_describe_a_scaling_rule() -> None:
    (more_time,) = parse_rules([{"action": "more_time", "factor": 1.5}])
    assert more_time.describe() == "time x1.5"
    (capped,) = parse_rules([{"action": "more_time", "cap": "2:00:00"}])
    assert capped.describe() == "time x2 (at most 2:00:00)"


@pytest.mark.parametrize(("table", "message"), [
    (3, "actions[1]: a rule is a table, not 3"),
    ({"action": "retry", "zz": 1, "colour": 2}, f"actions[1].colour: unknown field (known: {KNOWN})"),
    ({}, "actions[1].action: must be one of retry, more_memory, more_time, elsewhere, hold, fail, not None"),
    ({"action": "retry", "name": ""}, "actions[1].name: a non-empty name without ':', not ''"),
    ({"action": "retry", "name": "a:b"}, "actions[1].name: a non-empty name without ':', not 'a:b'"),
    ({"action": "retry", "name": 3}, "actions[1].name: a non-empty name without ':', not 3"),
    ({"action": "retry", "factor": 1}, "actions[1].factor: a number greater than 1, not 1"),
    ({"action": "retry", "factor": True}, "actions[1].factor: a number greater than 1, not True"),
    ({"action": "retry", "factor": "2"}, "actions[1].factor: a number greater than 1, not '2'"),
    ({"action": "retry", "max": -1},
     "actions[1].max: an integer >= 0 (the retries this rule may give one run), not -1"),
    ({"action": "retry", "max": True},
     "actions[1].max: an integer >= 0 (the retries this rule may give one run), not True"),
    ({"action": "retry", "max": 1.0},
     "actions[1].max: an integer >= 0 (the retries this rule may give one run), not 1.0"),
    ({"action": "retry", "cap": "4G"}, "actions[1].cap: a limit for more_memory or more_time (such as '64G' or "
                                       "'2-00:00:00'), not '4G' for action 'retry'"),
    ({"action": "more_memory", "cap": 1.5}, "actions[1].cap: a limit for more_memory or more_time (such as '64G' "
                                            "or '2-00:00:00'), not 1.5 for action 'more_memory'"),
    ({"action": "more_memory", "cap": "lots"}, "actions[1].cap: 'lots' is not a memory size"),
    ({"action": "more_time", "cap": "soon"}, "actions[1].cap: 'soon' is not a Slurm time"),
    ({"action": "elsewhere"}, "actions[1].set: the backend settings to change, a table given with action "
                              "'elsewhere' (and only with it), not {}"),
    ({"action": "retry", "set": {"a": 1}}, "actions[1].set: the backend settings to change, a table given with "
                                           "action 'elsewhere' (and only with it), not {'a': 1}"),
    ({"action": "elsewhere", "set": [1]}, "actions[1].set: the backend settings to change, a table given with "
                                          "action 'elsewhere' (and only with it), not [1]"),
    ({"action": "retry", "exit_codes": [5, 1]}, "actions[1].exit_codes: [low, high], two integers, not [5, 1]"),
    ({"action": "retry", "exit_codes": [1]}, "actions[1].exit_codes: [low, high], two integers, not [1]"),
    ({"action": "retry", "exit_codes": [1, 2, 3]},
     "actions[1].exit_codes: [low, high], two integers, not [1, 2, 3]"),
    ({"action": "retry", "exit_codes": (1, 2)}, "actions[1].exit_codes: [low, high], two integers, not (1, 2)"),
    ({"action": "retry", "exit_codes": [True, 2]},
     "actions[1].exit_codes: [low, high], two integers, not [True, 2]"),
    ({"action": "retry", "exit_codes": [1, "2"]},
     "actions[1].exit_codes: [low, high], two integers, not [1, '2']"),
    ({"action": "retry", "backends": 3}, "actions[1].backends: a name or a list of names, not 3"),
    ({"action": "retry", "backends": ["a", 3]}, "actions[1].backends: a name or a list of names, not ['a', 3]"),
    ({"action": "retry", "verdict": ["early", "soon"]},
     "actions[1].verdict: 'soon' is not one of early, late_handled, late_unhandled, failed, hold"),
    ({"action": "retry", "level": "kernel"},
     "actions[1].level: 'kernel' is not one of orchestrator, backend, batch, worker, application, user"),
    ({"action": "retry", "reason": 3}, "actions[1].reason: a regular expression, not 3"),
    ({"action": "retry", "stderr": "("},
     "actions[1].stderr: '(' is not a regular expression: missing ), unterminated subpattern at position 0"),
])
def test_refusals_say_where_and_what(table: Any, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_rules([table])
    assert str(caught.value) == message


def test_list_level_refusals() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_rules({"action": "retry"}, where="x.actions")
    assert str(caught.value) == "x.actions must be a list of tables ([[actions]]), not dict"
    with pytest.raises(ConfigError) as caught:
        parse_rules([{"action": "retry"}, {"action": "hold"}, {"name": "rule-1", "action": "fail"}])
    assert str(caught.value) == "actions[3].name: 'rule-1' is the name of an earlier rule"
    with pytest.raises(ConfigError) as caught:
        parse_rules([{"action": "retry"}, {"action": "reboot"}], where="w")
    assert str(caught.value).startswith("w[2].action: ")


def test_one_exit_code_range_and_its_bounds() -> None:
    (rule,) = parse_rules([{"action": "retry", "exit_codes": [3, 3]}])
    assert rule.exit_codes == (3, 3)
    assert rule.matches("b", "worker", "early", "", 3, None)
    assert not rule.matches("b", "worker", "early", "", 2, None)
    assert not rule.matches("b", "worker", "early", "", 4, None)
    assert not rule.matches("b", "worker", "early", "", None, None)


def test_megabytes() -> None:
    assert megabytes(512) == 512.0
    assert megabytes("2G") == 2048.0
    assert megabytes(" 1t ") == 1024.0 * 1024
    assert megabytes("2048K") == 2.0
    assert megabytes("7M") == 7.0
    assert megabytes("7") == 7.0
    with pytest.raises(ValueError):
        megabytes("")
    with pytest.raises(ValueError):
        megabytes("G")


@pytest.mark.parametrize(("text", "value"), [
    ("45", 45.0), ("2:30", 2.5), ("1:02:30", 62.5), ("2-3", 2 * 1440 + 180.0), ("2-3:04", 2 * 1440 + 184.0),
    ("2-3:04:30", 2 * 1440 + 184.5), (" 10 ", 10.0), (90, 90.0), ("0-0:0:6", 0.1),
])
def test_minutes(text: str | int, value: float) -> None:
    assert minutes(text) == pytest.approx(value)


def test_minutes_refusal() -> None:
    with pytest.raises(ValueError) as caught:
        minutes(" 1:2:3:4 ")
    assert str(caught.value) == "'1:2:3:4' is not a Slurm time"


def test_scaled() -> None:
    assert scaled("mem", "1G", 1.5, None) == "1536M"
    assert scaled("mem", "1K", 2, None) == "1M"  # never below one megabyte
    assert scaled("mem", "3G", 2, "5000") == "5000M"
    assert scaled("mem", "1G", 2, "4G") == "2048M"
    assert scaled("time", None, 2, None) == "120"  # unset: from an hour
    assert scaled("time", "0:10", 2, None) == "1"  # ten seconds twice over: at least a minute
    assert scaled("time", "10", 3, "20") == "20"
    assert scaled("time", "10", 1.5, "1:00:00") == "15"
    assert scaled("time", "10", 1.25, None) == "12"


def test_each_condition_can_refuse_a_match() -> None:
    (rule,) = parse_rules([{"action": "retry", "backends": "slurm", "level": "worker", "verdict": "early",
                            "reason": "OOM", "stderr": "killed"}])
    args = {"backend": "slurm", "level": "worker", "verdict": "early", "reason": "OOM", "exit_code": 1,
            "stderr": "was killed"}
    assert rule.matches(**args)  # type: ignore[arg-type]
    for key, other in (("backend", "ssh"), ("level", "batch"), ("verdict", "late_handled"), ("reason", "exit 1"),
                       ("stderr", "fine"), ("stderr", None)):
        assert not rule.matches(**{**args, key: other}), key  # type: ignore[arg-type]
