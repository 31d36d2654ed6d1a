"""Chrome trace export of a run: steps rebuilt from step times, ops per thread lane, in-flight ops
ending at the verdict, and the CLI that writes it."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from vigil.diagnose.hang import RunEvidence, diagnose
from vigil.diagnose.timeline import chrome_trace
from vigil.faces.cli.main import app
from vigil.model import VigilInputError
from vigil.sources.probe.records import OpRecord, RankSnapshot, snapshot_path

T0 = 1000.0


def rank(r: int, in_flight: bool) -> RankSnapshot:
    done = OpRecord(record_id=0, group="0", group_ranks=[0, 1], kind="collective", seq=1, op="all_reduce",
                    sizes=[[8]], dtypes=["float32"], state="completed", t_start=T0 + 1.0, t_end=T0 + 1.25,
                    thread="MainThread")
    ops = [done]
    if in_flight:
        ops.append(OpRecord(record_id=1, group="0", group_ranks=[0, 1], kind="collective", seq=2, op="all_reduce",
                            state="started", t_start=T0 + 3.0, thread="MainThread"))
    return RankSnapshot(rank=r, world_size=2, pid=10 + r, host="node-a", heartbeat=T0 + 9, started=T0,
                        ops=ops, steps=3, last_step=T0 + 2.5, step_times=[0.5, 1.0])


def test_trace_has_steps_ops_and_the_verdict() -> None:
    run = RunEvidence(world_size=2, snapshots={0: rank(0, True), 1: rank(1, False)}, trigger="hang",
                      detected_at=T0 + 10.0)
    trace = chrome_trace(run, diagnose(run))
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    steps = sorted((e["name"], e["ts"], e["dur"]) for e in spans if e["pid"] == 0 and e["cat"] == "step")
    assert steps == [("step 2", 1_000_000.0, 500_000.0), ("step 3", 1_500_000.0, 1_000_000.0)]
    ops = {e["name"]: e for e in spans if e["pid"] == 0 and e["cat"] == "collective"}
    assert ops["all_reduce #1"]["dur"] == 250_000.0
    # Still in flight at the verdict: drawn up to the verdict.
    assert ops["all_reduce #2"]["dur"] == 7_000_000.0 and ops["all_reduce #2"]["args"]["state"] == "started"
    verdicts = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert [e["pid"] for e in verdicts] == [1]  # rank 1 never entered all_reduce #2


def test_cli_writes_the_trace(tmp_path: Path) -> None:
    for r in (0, 1):
        snapshot_path(tmp_path, r).write_text(json.dumps(rank(r, r == 0).to_dict()))
    result = CliRunner().invoke(app, ["timeline", str(tmp_path)])
    assert result.exit_code == 0, result.output
    trace = json.loads((tmp_path / "timeline.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"]} == {0, 1}
    bad = CliRunner().invoke(app, ["timeline", str(tmp_path / "missing")])
    assert isinstance(bad.exception, VigilInputError)  # `vigil` turns it into one line and status 2
