"""Remediation: time from fault to resumed training, checkpoint stall, and the blast radius under a flood.

Run: .venv/bin/python bench/remedy.py   -> bench/results/remedy.json

1. Failover (real): the 2-rank gloo job of vigil_eval.tinytrain (200 steps, a checkpoint every 20,
   ~10 ms per step) runs once clean, then with one rank SIGKILLed at step 90 and once with one rank
   hung at step 90 (hang timeout 5 s). Per fault: detection latency (last sign of life -> detected),
   restart (detected -> ranks relaunched), resume (relaunched -> every rank past its restored step),
   the steps redone, and whether the final loss equals the clean run's to the bit. Baseline in the same
   run: the clean run's wall time, and what restarting from step 0 would have redone.
2. Checkpoint stall (real): how long training is blocked per checkpoint of an 8M-parameter model + Adam
   (inside save(), plus the final close), with DCP async_save (Vigil's default) vs DCP's blocking save.
3. Flood: 1,000 fault events (DRAIN / ISOLATE on random GPUs of a 100-node, 10-leaf cluster) through
   the default policies into the Remediator, guard on (10% of the cluster, 30% of a leaf) vs guard off,
   in dry-run; nodes that would go out of service, refused actions, audit completeness, events/s.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vigil.checkpoint.manager import CheckpointManager  # noqa: E402
from vigil.model import ActionKind, ActionStatus, Anomaly, FaultLevel, Gpu, Node, Topology  # noqa: E402
from vigil.remedy.actuators.base import OutboxActuator  # noqa: E402
from vigil.remedy.actuators.slurm import SlurmActuator  # noqa: E402
from vigil.remedy.audit import AuditLog  # noqa: E402
from vigil.remedy.guard import BlastRadiusGuard  # noqa: E402
from vigil.remedy.jobspec import TrainingJob  # noqa: E402
from vigil.remedy.lifecycle import LifecycleStore  # noqa: E402
from vigil.remedy.policy import PolicyEngine, load_policies  # noqa: E402
from vigil.remedy.remediator import Remediator  # noqa: E402
from vigil.run.failover import FailoverSupervisor, LocalJob  # noqa: E402

RESULTS = REPO / "bench" / "results"
console = Console()
STEPS, EVERY, FAULT_STEP = 200, 20, 90


def job(name: str) -> TrainingJob:
    return TrainingJob.from_dict(
        {
            "metadata": {"name": name},
            "spec": {
                "replicas": 2,
                "command": [
                    "python",
                    "-m",
                    "vigil_eval.tinytrain",
                    "--steps",
                    str(STEPS),
                    "--step-seconds",
                    "0.01",
                ],
                "devices": ["cpu:0", "cpu:1", "cpu:2"],
                "checkpoint": {"everySteps": EVERY, "keepLast": 2},
                "failoverPolicy": {"maxRetries": 2},
                "healthCheck": {"hangTimeout": "5s"},
            },
        }
    )


def progress(run_dir: Path) -> list[dict[str, Any]]:
    lines = []
    for path in sorted(run_dir.glob("progress-rank*.jsonl")):
        lines.extend(json.loads(line) for line in path.read_text().splitlines())
    return lines


def failover(root: Path) -> dict[str, Any]:
    audit = AuditLog(f"sqlite:///{root}/remedy.db")
    started = time.time()
    clean_job = LocalJob(job("clean"), root / "clean")
    clean = FailoverSupervisor(clean_job, audit).run()
    clean_s = time.time() - started
    # Cold start of the same job (processes, imports, gloo rendezvous, first step): the floor a restart
    # cannot beat without warm spare processes.
    cold_start_s = min(line["ts"] for line in progress(root / "clean") if "loss" in line) - clean_job.started_at
    reference = json.loads((root / "clean" / "result.json").read_text())["final_loss_hex"]
    step_s = clean_s / STEPS
    out: dict[str, Any] = {
        "clean_run_s": clean_s,
        "cold_start_s": cold_start_s,
        "clean_ok": clean.succeeded,
        "faults": {},
    }
    for kind in ("kill", "hang"):
        run_dir = root / kind
        env = {"VIGIL_INJECT_FAULT": f"{kind}:rank=1:step={FAULT_STEP}"}
        started = time.time()
        report = FailoverSupervisor(LocalJob(job(kind), run_dir, env=env), audit).run()
        wall = time.time() - started
        lines = progress(run_dir)
        recovery = report.recoveries[0]
        # Last sign of life before the fault: the newest step line written before detection.
        last_alive = max(line["ts"] for line in lines if "loss" in line and line["ts"] <= recovery["detected"])
        restored = [line["step"] for line in lines if line.get("event") == "start" and line["step"] > 0]
        final = json.loads((run_dir / "result.json").read_text())["final_loss_hex"]
        out["faults"][kind] = {
            "succeeded": report.succeeded,
            "detect_s": recovery["detected"] - last_alive,
            "restart_s": recovery["restarted"] - recovery["detected"],
            "resume_s": recovery["resumed"] - recovery["restarted"],
            "fault_to_resumed_s": recovery["resumed"] - last_alive,
            "restored_step": restored[0] if restored else None,
            "steps_redone": FAULT_STEP - 1 - restored[0] if restored else None,
            "steps_redone_from_scratch": FAULT_STEP - 1,
            "run_wall_s": wall,
            "bit_identical_final_loss": final == reference,
            "est_step_s": step_s,
        }
    out["audit_actions"] = [(a.kind.value, a.status.value) for a in audit.actions()]
    return out


def checkpoint_stall(root: Path, saves: int = 8, layers: int = 8) -> dict[str, Any]:
    """Time the training loop is blocked per checkpoint: inside save() (and the final close).

    Sync and async saves alternate on two identical models, so both see the same machine load.
    """
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    setups = {}
    for mode in ("sync", "async"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(layers)])
        # Adam: its state exists after the first step (with stateless SGD, DCP's get_state_dict would run
        # a dummy optimizer step on every save to discover the state layout).
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        manager = CheckpointManager(root / mode, keep_last=2, async_save=mode == "async")
        setups[mode] = (model, optimizer, manager)
    blocked: dict[str, list[float]] = {"sync": [], "async": []}
    batch = torch.randn(64, 1024)
    for step in range(1, saves + 1):
        for mode, (model, optimizer, manager) in setups.items():
            for _ in range(3):  # some training between saves, for the async write to overlap with
                loss = model(batch).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            started = time.perf_counter()
            manager.save(step, model, optimizer)
            blocked[mode].append(time.perf_counter() - started)
    results: dict[str, Any] = {}
    for mode, (_, _, manager) in setups.items():
        started = time.perf_counter()
        manager.close()
        results[mode] = {
            "blocked_per_save_s": sorted(blocked[mode])[len(blocked[mode]) // 2],
            "blocked_total_s": sum(blocked[mode]) + time.perf_counter() - started,
        }
    results["params"] = sum(p.numel() for p in setups["sync"][0].parameters())
    results["async_over_sync"] = results["async"]["blocked_per_save_s"] / results["sync"]["blocked_per_save_s"]
    return results


def flood(root: Path, events: int = 1000) -> dict[str, Any]:
    topology = Topology(
        nodes=[
            Node(name=f"n{i:03d}", switch=f"leaf{i // 10}", gpus=[Gpu(node=f"n{i:03d}", index=g) for g in range(8)])
            for i in range(100)
        ]
    )
    out = {}
    for guarded in (True, False):
        url = f"sqlite:///{root}/flood-{guarded}.db"
        lifecycle, audit = LifecycleStore(url), AuditLog(url)
        guard = BlastRadiusGuard(topology, lifecycle, max_share=0.1, max_share_per_switch=0.3) if guarded else None
        remediator = Remediator(
            [SlurmActuator(), OutboxActuator(root / "outbox.jsonl")], audit, lifecycle=lifecycle, guard=guard
        )
        engine = PolicyEngine(load_policies())
        rng = random.Random(7)
        returned = []
        started = time.perf_counter()
        for _ in range(events):
            node = rng.choice(topology.nodes)
            anomaly = Anomaly(
                entity=f"gpu/{node.name}/{rng.randrange(8)}",
                start=0,
                end=0,
                detector="flood",
                fault_type=rng.choice(["xid_79", "xid_119", "ecc_dbe", "nvlink_down"]),
                level=rng.choice([FaultLevel.DRAIN, FaultLevel.ISOLATE]),
            )
            returned.extend(remediator.handle(anomaly, engine))
        elapsed = time.perf_counter() - started
        taken = {
            a.target
            for a in returned
            if a.kind in (ActionKind.CORDON, ActionKind.DRAIN, ActionKind.REBOOT) and a.status is ActionStatus.PROPOSED
        }
        per_leaf = Counter(topology.node(n.removeprefix("node/")).switch for n in taken)
        audited = {a.id for a in audit.actions()}
        out["guard_on" if guarded else "guard_off"] = {
            "events": events,
            "actions": len(returned),
            "statuses": dict(Counter(a.status.value for a in returned)),
            "nodes_out": len(taken),
            "max_per_leaf": max(per_leaf.values()) if per_leaf else 0,
            "audited_all": audited == {a.id for a in returned},
            "events_per_s": events / elapsed,
        }
    return out


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="vigil-bench-remedy-") as tmp:
        root = Path(tmp)
        with console.status("failover: clean run, kill, hang (real 2-rank gloo jobs)"):
            fo = failover(root / "failover")
        with console.status("checkpoint stall: none / sync / async"):
            ck = checkpoint_stall(root / "ckpt")
        with console.status("flood: 1,000 fault events, guard on / off"):
            fl = flood(root)
    results = {"failover": fo, "checkpoint": ck, "flood": fl, "ts": time.time()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "remedy.json").write_text(json.dumps(results, indent=2))

    table = Table(title=f"Failover: 2-rank gloo job, {STEPS} steps, checkpoint every {EVERY}, fault at {FAULT_STEP}")
    for column in (
        "fault",
        "detect s",
        "restart s",
        "resume s",
        "fault->resumed s",
        "steps redone",
        "from scratch",
        "bit-identical",
    ):
        table.add_column(column, justify="right")
    for kind, f in fo["faults"].items():
        table.add_row(
            kind,
            f"{f['detect_s']:.2f}",
            f"{f['restart_s']:.2f}",
            f"{f['resume_s']:.2f}",
            f"{f['fault_to_resumed_s']:.2f}",
            str(f["steps_redone"]),
            str(f["steps_redone_from_scratch"]),
            str(f["bit_identical_final_loss"]),
        )
    table.caption = (
        f"same session: clean run {fo['clean_run_s']:.1f} s; cold start to first step "
        f"{fo['cold_start_s']:.1f} s (the floor for 'resume')"
    )
    console.print(table)

    table = Table(title=f"Checkpoint stall, {ck['params'] / 1e6:.0f}M-parameter model, training blocked per save")
    for column in ("mode", "median blocked per save s", "total blocked s", "ratio to sync"):
        table.add_column(column, justify="right")
    for mode in ("sync", "async"):
        ratio = ck[mode]["blocked_per_save_s"] / ck["sync"]["blocked_per_save_s"]
        table.add_row(
            mode, f"{ck[mode]['blocked_per_save_s']:.3f}", f"{ck[mode]['blocked_total_s']:.2f}", f"{ratio:.2f}"
        )
    console.print(table)

    table = Table(title="Flood: 1,000 fault events, 100 nodes / 10 leaves, limits 10% cluster / 30% leaf (dry-run)")
    for column in ("guard", "actions", "nodes out", "max per leaf", "refused", "audited all", "events/s"):
        table.add_column(column, justify="right")
    for name, f in fl.items():
        table.add_row(
            name,
            str(f["actions"]),
            str(f["nodes_out"]),
            str(f["max_per_leaf"]),
            str(f["statuses"].get("refused", 0)),
            str(f["audited_all"]),
            f"{f['events_per_s']:.0f}",
        )
    console.print(table)


if __name__ == "__main__":
    main()
