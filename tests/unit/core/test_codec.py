"""Events as JSON (core.codec): the plain form of each kind of value, and ``decode(encode(e)) == e``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.core import codec
from orchestrator.core import events as ev
from orchestrator.core.actions import parse_rules
from orchestrator.core.analyser import Limits
from orchestrator.core.errors import JobError
from orchestrator.core.ids import Runs
from orchestrator.core.runlog import RunLog
from orchestrator.core.statuses import JobStatus

S = JobStatus
RULES = parse_rules([{"name": "oom", "action": "more_memory", "exit_codes": [1, 9], "cap": "8G"},
                     {"action": "elsewhere", "set": {"partition": "b"}}])
PROFILE = ev.Profile("slurm", native_submit=False, wrapper=True, limits=Limits(1, 2, 3, 30.0, 4),
                     checkpointable=True, max_restarts=5, splits=True, actions=RULES, min_success=0.5)
LOG = RunLog(started=1.0, host="h", exit_code=3, ended=2.0, end_code=0, keywords=[(1.5, "RETRY", "a b")])
T: Any = {"stimulus_id": "s-1", "time": 12.5}

EVENTS: list[ev.Event] = [
    ev.AddRequested(**T, targets=((3,),), profile=PROFILE, link=(2, "prejob")),
    ev.AddRequested(**T, targets=((3,),), profile=ev.Profile("sim")),
    ev.SubmitRequested(**T, targets=((3,), (4, 1)), keep_going=True, profiles={3: PROFILE}),
    ev.KillRequested(**T, targets=((3, 0),)),
    ev.ResubmitRequested(**T, targets=((3,),), only_failed=False, profile=PROFILE, backend={"mem": "2G"},
                         start="given"),
    ev.ReleaseRequested(**T, targets=((3,),), retry_args=("x", "y")),
    ev.ReleaseRequested(**T, targets=((3,),)),
    ev.ForceStatusRequested(**T, targets=((3,),), status=S.COMPLETED, force=True),
    ev.RemoveRequested(**T, targets=((3,),)),
    ev.MergeRequested(**T, targets=((3,),)),
    ev.Prepared(**T, job=3, n_subjobs=7),
    ev.PrepareFailed(**T, job=3, error=JobError("bad", fqid="3", field="splitter")),
    ev.SubmitOutcomes(**T, runs=Runs(3, range(0, 4)), accepted=(0, 1), rejected=((2, "full"),), not_attempted=(3,),
                      native=False, states={0: {"seq": 2, "label": "L"}}, more=True, first=0),
    ev.SubmitOutcomes(**T, runs=Runs(3, (1, 5, 9)), accepted=(0,)),
    ev.SubmitOutcomes(**T, runs=Runs(3)),
    ev.KillOutcomes(**T, runs=Runs(3, (1, 2)), killed=(0,), failed=((1, "gone"),), not_attempted=()),
    ev.LookupOutcomes(**T, runs=Runs(3, range(2, 5)), found=(0,), absent=(1, 2)),
    ev.StatusReport(**T, backend="slurm", reports=(
        ev.RunReport(Runs(3, (0, 2)), S.FAILED, exit_code=1, reason="r", verdict="lost", log=LOG, stderr_tail="e",
                     state={"seq": 1}, usage={"cpu": 1.5}, started=1.0, ended=2.0),
        ev.RunReport(Runs(4), S.RUNNING))),
    ev.RunLost(**T, runs=Runs(3, (4,)), reason="silent"),
    ev.LinkedAdded(**T, job=5, master=3, role="aggregator", profile=PROFILE),
    ev.PostprocessDone(**T, job=3, error="merge failed", failed_subjobs=((1, "bad"),)),
    ev.PostprocessDone(**T, job=3),
    ev.Started(**T),
    ev.RetryDue(**T, runs=Runs(3, (1,))),
    ev.StatusChanged(**T, changed=Runs(3, range(0, 2)), old=S.RUNNING, new=S.COMPLETED, forced=True),
    ev.StatusChanged(**T, changed=((3, 1), (4,)), old=S.NEW, new=S.SUBMITTING),
]


@pytest.mark.parametrize("event", EVENTS, ids=[f"{type(e).__name__}-{n}" for n, e in enumerate(EVENTS)])
def test_every_event_round_trips_through_json(event: ev.Event) -> None:
    data = json.loads(json.dumps(codec.encode(event)))
    assert data["type"] == type(event).__name__
    back = codec.decode(data)
    assert type(back) is type(event)
    assert back == event or type(event) is ev.PrepareFailed


def test_every_event_type_is_known() -> None:
    assert set(codec.TYPES) == set(ev.__all__) - {"Event", "Profile", "RunReport"}
    assert "Event" not in codec.TYPES and codec.TYPES["Started"] is ev.Started


def test_plain_forms() -> None:
    data = codec.encode(EVENTS[12])
    assert data == {"type": "SubmitOutcomes", "stimulus_id": "s-1", "time": 12.5,
                    "runs": {"job": 3, "range": [0, 4]}, "accepted": [0, 1], "rejected": [[2, "full"]],
                    "not_attempted": [3], "native": False, "states": {"0": {"seq": 2, "label": "L"}},
                    "more": True, "first": 0}
    assert codec.encode(EVENTS[13])["runs"] == {"job": 3, "indexes": [1, 5, 9]}
    assert codec.encode(EVENTS[14])["runs"] == {"job": 3, "indexes": None}
    changed = codec.encode(EVENTS[-2])
    assert changed["old"] == "running" and changed["new"] == "completed"
    assert codec.encode(EVENTS[-1])["changed"] == [[3, 1], [4]]


def test_an_error_travels_as_its_message_fqid_and_field() -> None:
    data = codec.encode(EVENTS[11])
    assert data["error"] == {"message": "job 3: bad [field splitter]", "fqid": "3", "field": "splitter"}
    back = codec.decode(json.loads(json.dumps(data)))
    assert isinstance(back, ev.PrepareFailed)
    assert isinstance(back.error, JobError)
    assert str(back.error) == "job 3: bad [field splitter]"
    assert back.error.fqid == "3" and back.error.field == "splitter"
    bare = codec.decode({**data, "error": {"message": "m"}})
    assert isinstance(bare, ev.PrepareFailed) and str(bare.error) == "m"
    assert bare.error.fqid is None and bare.error.field is None


def test_a_profile_decodes_into_its_rules_and_limits() -> None:
    back = codec.decode(json.loads(json.dumps(codec.encode(EVENTS[0]))))
    assert isinstance(back, ev.AddRequested)
    assert back.profile == PROFILE
    assert back.profile.limits == Limits(1, 2, 3, 30.0, 4)
    assert back.profile.actions == RULES and back.profile.actions[1].settings == (("partition", "b"),)
    assert back.targets == ((3,),) and back.link == (2, "prejob")


def test_a_report_decodes_into_its_log() -> None:
    back = codec.decode(json.loads(json.dumps(codec.encode(EVENTS[17]))))
    assert isinstance(back, ev.StatusReport)
    first = back.reports[0]
    assert first.log == LOG and first.log.keywords == [(1.5, "RETRY", "a b")]
    assert first.runs == Runs(3, (0, 2)) and first.status == S.FAILED


def test_maps_keyed_by_integers_come_back_so() -> None:
    back = codec.decode(json.loads(json.dumps(codec.encode(EVENTS[2]))))
    assert isinstance(back, ev.SubmitRequested)
    assert list(back.profiles) == [3] and back.profiles[3] == PROFILE


def test_missing_fields_take_their_defaults_and_nulls_stay_null() -> None:
    assert codec.decode({"type": "Started", "stimulus_id": "x", "time": 1}) == ev.Started(stimulus_id="x", time=1)
    back = codec.decode({"type": "PostprocessDone", "stimulus_id": "x", "time": 1, "job": 2, "error": None})
    assert back == ev.PostprocessDone(stimulus_id="x", time=1, job=2)


def test_not_an_event() -> None:
    with pytest.raises(ValueError, match=r"^not an event: 'Nope'$"):
        codec.decode({"type": "Nope"})
    with pytest.raises(ValueError, match=r"^not an event: None$"):
        codec.decode({})
    with pytest.raises(ValueError, match="not an event: 'Event'"):
        codec.decode({"type": "Event", "stimulus_id": "x", "time": 1})


def test_a_batch_of_runs_must_be_a_mapping_and_a_sequence_a_list() -> None:
    data: dict[str, Any] = {"type": "RetryDue", "stimulus_id": "x", "time": 1.0, "runs": [3, 1]}
    with pytest.raises(TypeError, match="^not a batch of runs$"):
        codec.decode(data)
    data = {"type": "KillOutcomes", "stimulus_id": "x", "time": 1.0, "runs": {"job": 3, "indexes": None},
            "killed": "0"}
    with pytest.raises(TypeError, match="^not a sequence$"):
        codec.decode(data)


def test_any_sequence_encodes_as_a_list() -> None:
    event = ev.SubmitOutcomes(stimulus_id="x", time=1.0, runs=Runs(3, (4, 5)), accepted=range(2),
                              not_attempted=[1])
    data = json.loads(json.dumps(codec.encode(event)))
    assert data["accepted"] == [0, 1] and data["not_attempted"] == [1]
    back = codec.decode(data)
    assert isinstance(back, ev.SubmitOutcomes) and back.accepted == (0, 1)
