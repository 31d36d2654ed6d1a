from __future__ import annotations

from vigil.run.pipeline import run_pipeline
from vigil.sources.sim import FaultPlan, SimConfig, simulate


def test_a_pipeline_that_keeps_no_events_finds_the_same_incidents() -> None:
    """The ranks' watchdog lines of a hang are decoded and judged either way; only the result's copy of the
    events is left out."""
    hang = FaultPlan("job_hang", "job/j00/rank/3", start_s=30 * 60, duration_s=14 * 60)
    run = simulate(SimConfig(nodes=2, minutes=60, seed=2, plans=(hang,), benign_noise=False))
    kept, dropped = run_pipeline(run), run_pipeline(run, keep_events=False)
    assert sum(e.kind == "rank_log" for e in kept.events) >= 7
    assert dropped.events == []
    assert [(i.title, i.scope, i.entities, i.start, i.end, i.fault_types) for i in dropped.incidents] == [
        (i.title, i.scope, i.entities, i.start, i.end, i.fault_types) for i in kept.incidents]
    assert [i.scope for i in dropped.incidents] == ["job/j00/rank/3"]
    assert [(a.entity, a.fault_type, a.start) for a in dropped.anomalies] == [
        (a.entity, a.fault_type, a.start) for a in kept.anomalies]
