"""Crash safety of the actuators: what the execution journal (idempotency keys) costs per action, and how
long recovery after a crash takes.

Run: .venv/bin/python bench/crash_safety.py   -> bench/results/crash_safety.json

An in-process actuator that does nothing isolates Vigil's own cost. Per action, on SQLite (WAL) in a temp
directory: Remediator.execute with the journal (begin + finish + the audit record), against the same run's
baseline of the audit record alone (what an action cost before the journal). Recovery: 200 intents left
"started" (as a kill -9 leaves them), then Remediator.recover() resumes each once.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from vigil.model import Action, ActionKind
from vigil.remedy.actuators.base import Actuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator

RESULTS = Path(__file__).resolve().parent / "results" / "crash_safety.json"
ACTIONS = 300
INTERRUPTED = 200


class NoOp(Actuator):
    name = "noop"
    kinds = frozenset({ActionKind.CORDON})
    target_kinds = frozenset({"node"})

    def execute(self, action: Action) -> str:
        return "done"

    def describe(self, action: Action) -> str:
        return "nothing"


def _action(i: int) -> Action:
    return Action(id=f"act-{i:06d}", ts=float(i), kind=ActionKind.CORDON, target=f"node/n{i}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        audit = AuditLog(f"sqlite:///{Path(tmp) / 'vigil.db'}")
        remediator = Remediator([NoOp()], audit, dry_run=False)
        baseline, journaled = [], []
        for i in range(ACTIONS):
            start = time.perf_counter()
            audit.record(_action(1_000_000 + i))
            baseline.append(time.perf_counter() - start)
            start = time.perf_counter()
            remediator.execute(_action(i))
            journaled.append(time.perf_counter() - start)
        for i in range(INTERRUPTED):
            audit.begin(f"act-{2_000_000 + i}", _action(2_000_000 + i))
        start = time.perf_counter()
        recovered = remediator.recover()
        recovery_s = time.perf_counter() - start
        resumed_twice = sum(1 for a in remediator.recover())  # a second restart finds nothing left to resume
    rows = {
        "actions": ACTIONS,
        "audit_record_only_ms_median": round(statistics.median(baseline) * 1000, 3),
        "execute_with_journal_ms_median": round(statistics.median(journaled) * 1000, 3),
        "execute_with_journal_ms_p95": round(sorted(journaled)[int(0.95 * ACTIONS)] * 1000, 3),
        "interrupted_intents": INTERRUPTED,
        "recovered": len(recovered),
        "recovery_s": round(recovery_s, 3),
        "resumed_again_on_second_restart": resumed_twice,
    }
    print(f"{'measure':42s} value")
    for key, value in rows.items():
        print(f"{key:42s} {value}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"method": __doc__.split("Run:")[0].strip(), **rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
