"""The action table's pure parts: parsing rules (errors name the rule's position and field), matching, scaling."""

from __future__ import annotations

import pytest

from orchestrator.core.actions import Rule, choose, minutes, parse_rules, scaled
from orchestrator.core.errors import ConfigError


def name(rule: Rule | None) -> str | None:
    return None if rule is None else rule.name


def test_first_matching_rule_wins_and_every_condition_must_hold() -> None:
    rules = parse_rules([
        {"name": "oom", "backends": ["slurm"], "reason": "OUT_OF_MEMORY", "action": "more_memory", "cap": "8G"},
        {"name": "codes", "exit_codes": [137, 143], "level": ["application", "worker"], "action": "retry", "max": 1},
        {"name": "noisy", "stderr": "No space left", "action": "hold"},
        {"name": "rest", "level": "orchestrator", "action": "fail"},
    ])
    assert name(choose(rules, "slurm", "worker", "early", "Slurm: OUT_OF_MEMORY (x)", None, None)) == "oom"
    assert name(choose(rules, "ssh", "worker", "early", "Slurm: OUT_OF_MEMORY (x)", 137, None)) == "codes"
    assert name(choose(rules, "ssh", "application", "early", "exit code 1", 1, "disk: No space left")) == "noisy"
    assert choose(rules, "ssh", "application", "early", "exit code 1", 1, "other") is None
    assert name(choose(rules, "local", "orchestrator", "late_unhandled", "lost", None, None)) == "rest"
    assert rules[0].describe() == "mem x2 (at most 8G)" and rules[0].counter == "rule:oom"


@pytest.mark.parametrize(("tables", "message"), [
    ([{"action": "retry"}, {"action": "reboot"}], "actions[2].action: must be one of"),
    ([{"action": "more_memory", "factor": 0.5}], "actions[1].factor: a number greater than 1"),
    ([{"action": "retry", "max": -1}], "actions[1].max"),
    ([{"action": "retry", "reason": "("}], "actions[1].reason: '(' is not a regular expression"),
    ([{"action": "retry", "level": "kernel"}], "actions[1].level: 'kernel' is not one of"),
    ([{"action": "more_time", "cap": "soon"}], "actions[1].cap: 'soon' is not a Slurm time"),
    ([{"action": "elsewhere"}], "actions[1].set"),
    ([{"action": "retry", "exit_codes": [5, 1]}], "actions[1].exit_codes"),
    ([{"action": "retry", "colour": "red"}], "actions[1].colour: unknown field"),
    ([{"name": "a", "action": "retry"}, {"name": "a", "action": "fail"}], "actions[2].name: 'a' is the name"),
    ({"action": "retry"}, "actions must be a list of tables"),
])
def test_a_malformed_rule_is_refused_naming_its_position_and_field(tables: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        parse_rules(tables)


def test_memory_and_time_scale_up_to_their_cap() -> None:
    assert scaled("mem", "100", 2, None) == "200M"
    assert scaled("mem", "3G", 2, "4G") == "4096M"
    assert scaled("mem", None, 2, None) == "2048M"  # unset: from 1 GiB
    assert scaled("time", "1", 2, None) == "2"
    assert scaled("time", "1-00:00:00", 2, "36:00:00") == "2160"
    assert minutes("2:30") == 2.5 and minutes("1:00:00") == 60 and minutes("2-3") == 2 * 1440 + 180
    with pytest.raises(ValueError):
        minutes("later")
