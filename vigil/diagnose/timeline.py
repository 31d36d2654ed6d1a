"""Per-rank timeline of a run as a Chrome trace (Trace Event Format), viewable in Perfetto or
chrome://tracing: one process per rank, a lane for its training steps, one for every thread that
issued communication ops, and the verdict as an instant event.

Steps are rebuilt from what the probe keeps (the time of the last step and the durations of the
recent ones), ops from the rank's op ring; an op still in flight at the verdict ends at the verdict.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vigil.diagnose.hang import HangDiagnosis, RunEvidence
from vigil.sources.probe.records import RankSnapshot

TIMELINE_FILE = "timeline.json"
STEP_LANE = 0


def _us(seconds: float, origin: float) -> float:
    return round((seconds - origin) * 1e6, 1)


def chrome_trace(run: RunEvidence, diagnosis: HangDiagnosis | None = None) -> dict[str, Any]:
    """The run as ``{"traceEvents": [...]}``; timestamps in microseconds from the earliest rank start."""
    if not run.snapshots:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    origin = min(s.started for s in run.snapshots.values())
    events: list[dict[str, Any]] = []
    for rank, snap in sorted(run.snapshots.items()):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank} ({snap.host})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": STEP_LANE, "args": {"name": "steps"}})
        events.extend(_steps(rank, snap, origin))
        events.extend(_ops(rank, snap, origin, run.detected_at))
    if diagnosis is not None and diagnosis.verdict != "ok":
        for rank in diagnosis.culprit_ranks or sorted(run.snapshots):
            events.append({"ph": "i", "s": "p", "name": f"verdict: {diagnosis.verdict}", "pid": rank,
                           "tid": STEP_LANE, "ts": _us(run.detected_at, origin),
                           "args": {"summary": diagnosis.summary}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"job": run.job, "origin_s": origin}}


def _steps(rank: int, snap: RankSnapshot, origin: float) -> list[dict[str, Any]]:
    if snap.last_step is None:
        return []
    events = []
    end = snap.last_step
    first = snap.steps - len(snap.step_times)
    for index, duration in reversed(list(enumerate(snap.step_times))):
        start = end - duration
        events.append({"ph": "X", "name": f"step {first + index + 1}", "cat": "step", "pid": rank,
                       "tid": STEP_LANE, "ts": _us(start, origin), "dur": round(duration * 1e6, 1)})
        end = start
    return events


def _ops(rank: int, snap: RankSnapshot, origin: float, now: float) -> list[dict[str, Any]]:
    lanes: dict[str, int] = {}
    events: list[dict[str, Any]] = []
    for op in snap.ops:
        lane = lanes.get(op.thread or "main")
        if lane is None:
            lane = lanes[op.thread or "main"] = len(lanes) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": lane,
                           "args": {"name": f"comm ({op.thread or 'main'})"}})
        end = op.t_end if op.t_end is not None else max(now, op.t_start)
        name = f"{op.op} #{op.seq}" if op.kind == "collective" else f"{op.op} peer {op.peer} #{op.seq}"
        events.append({
            "ph": "X", "name": name, "cat": op.kind, "pid": rank, "tid": lane,
            "ts": _us(op.t_start, origin), "dur": round((end - op.t_start) * 1e6, 1),
            "args": {"group": op.group, "state": op.state, "sizes": op.sizes, "dtypes": op.dtypes,
                     "async": op.is_async},
        })
    return events


def write_timeline(directory: Path, run: RunEvidence, diagnosis: HangDiagnosis | None = None) -> Path:
    path = directory / TIMELINE_FILE
    path.write_text(json.dumps(chrome_trace(run, diagnosis)))
    return path
