"""Two requests no other unit test reached: ``merge`` (postprocessors again) and ``resubmit(backend=...)``."""

from __future__ import annotations

from orchestrator.core.events import MergeRequested, PostprocessDone, ResubmitRequested
from orchestrator.core.instructions import RunPostprocess, SendSubmit, SetBackend
from orchestrator.core.statuses import JobStatus

from .harness import Harness, only, profile, reply

S = JobStatus


def ended_master(h: Harness, postprocess: bool = True) -> int:
    m = h.add(postprocess=postprocess)
    h.submit_all(m, 2)
    step = h.report(m, [0, 1], S.COMPLETED)
    if postprocess:
        assert step.of(RunPostprocess) == [RunPostprocess(stimulus_id=step.stimulus_id, job=m)]
        h.post(PostprocessDone(stimulus_id=step.stimulus_id, time=h.clock, job=m))
    return m


# ------------------------------------------------------------------ merge
def test_merge_runs_the_postprocessors_of_an_ended_master_again() -> None:
    h = Harness()
    m = ended_master(h)
    assert not h.sm.active((m,))
    step = h.request(MergeRequested, m)
    assert step.of(RunPostprocess) == [RunPostprocess(stimulus_id=step.stimulus_id, job=m)]
    r = reply(step)
    assert r.error is None and r.acted == 1
    assert h.sm.active((m,)) and not h.sm.active((m,), postprocess=False)
    assert m in h.sm.take_dirty()[1]
    # while they run, a second merge is refused
    r = reply(h.request(MergeRequested, m))
    assert str(r.error) == f"job {m}: is completed: its postprocessors run by themselves once it ends"
    h.post(PostprocessDone(stimulus_id=step.stimulus_id, time=h.clock, job=m))
    assert reply(h.request(MergeRequested, m)).error is None


def test_merge_refusals() -> None:
    h = Harness()
    m = ended_master(h)
    plain = ended_master(h, postprocess=False)
    r = reply(h.request(MergeRequested, (m, 0)))
    assert str(r.error) == f"job {m}.0: only a master's subjobs are merged (name the master)"
    assert r.acted == 0
    r = reply(h.request(MergeRequested, plain))
    assert str(r.error) == f"job {plain}: has no merger or postprocessor to run"
    single = h.add(splits=False, postprocess=True)
    r = reply(h.request(MergeRequested, single))
    assert str(r.error) == f"job {single}: only a master's subjobs are merged (name the master)"
    running = h.add(postprocess=True)
    h.submit_all(running, 2)
    r = reply(h.request(MergeRequested, running))
    assert str(r.error) == f"job {running}: is submitted: its postprocessors run by themselves once it ends"
    assert not [i for s in h.steps[-4:] for i in s.of(RunPostprocess)]


# ------------------------------------------------------------------ resubmit with the backend's settings changed
def test_resubmit_with_new_backend_settings() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 2)
    h.report(m, [0, 1], S.FAILED, exit_code=1)
    new = profile(lookup=True)
    step = h.request(ResubmitRequested, m, profile=new, backend={"mem": 4})
    assert step.of(SetBackend) == [SetBackend(stimulus_id=step.stimulus_id, job=m, backend={"mem": 4}, subjobs=2)]
    assert step.instructions.index(only(step, SetBackend)) < step.instructions.index(only(step, SendSubmit))
    assert h.sm.profile(m) == new


def test_resubmit_cannot_change_the_backend_type() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 2)
    h.report(m, [0, 1], S.FAILED, exit_code=1)
    step = h.request(ResubmitRequested, m, profile=profile("slurm"), backend={"x": 1})
    error = reply(step).error
    assert str(error) == (f"resubmit stopped: job {m}: resubmit may change the backend's settings, not its type "
                          "(sim -> slurm) [field backend]")
    assert not step.of(SetBackend) and not step.of(SendSubmit)
    assert h.sm.profile(m) == profile()
    assert h.status(m) == S.FAILED


def test_resubmit_without_backend_keeps_the_profile() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 1)
    h.report(m, [0], S.FAILED, exit_code=1)
    step = h.request(ResubmitRequested, m, profile=profile("slurm"))
    assert step.of(SendSubmit) and not step.of(SetBackend)
    assert h.sm.profile(m) == profile()
