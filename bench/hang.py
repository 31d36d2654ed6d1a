"""Hang detection and culprit localization on real gloo jobs, probe overhead, stack merge at scale,
and a side-by-side with torch's Flight Recorder analyzer on the same dumps.

Run: .venv/bin/python bench/hang.py [--hang-timeout 10] [--quick] [--stacks-only] [--new-only]
    -> bench/results/hang.json

1. Scenarios: tests/probe/fault_job.py as a 3-rank gloo job through `vigil.run.launcher.launch`, one fault
   injected into one rank; verdict, culprit and detection latency (seconds from the job's last progress to
   the verdict) against the ground truth. Target: verdict within hang timeout + 5 s, <= 15 s with the
   default 10 s; culprit accuracy 100%.
2. Probe overhead: bench/jobs/train_small.py (2 ranks, a 1024-2048-1024 MLP, one all_reduce per
   gradient, 5 collectives per step) under `launch`, with the probe's hooks switched off and on every 20
   steps in the same processes; the ratio of median step times (and of paired blocks). Also whole runs
   alternating plain vs launched, and the probe's cost per op in microseconds. Target <= 3%, goal <= 1%.
3. Stack merge: 10,000 synthetic ranks (several states, varying line numbers) merged into the prefix
   tree and the fork point found. Target < 1 s.
5. Stacks: tests/probe/stack_job.py under DDP (the probe's Python comm hook, and the built-in C++ hook
   whose collectives never pass through Python), FSDP2, hand-written collectives, functional collectives
   (world group; a 2 x 2 DeviceMesh sub-group) and the c10d_functional operators of a compiled graph (no op
   recorded): a rank stuck in forward (for the last, in its first forward: a hang before any step, judged
   from every rank's stack past the start-up allowance), uneven inputs, a 0.6 s/step straggler, a crash, a
   C call holding the GIL, three long pauses that are not hangs (checkpoint save, evaluation loop,
   data-loader warm-up), and an FSDP2 job on two "nodes" (two `vigil launch` processes); plus what the probe
   adds to a DDP step (Python hook + op record + compute marks vs the built-in C++ hook without the probe).
6. Periodic stacks: two two-node DDP jobs on "machines" node-a and node-b with py-spy sweeps every second, a
   slow rank on node-b in both; `vigil stacks` must flag node-b and not node-a.
7. New scenarios (tests/probe/realistic_job.py), written after the detector the way ML engineers' jobs look,
   each verdict fixed before Vigil first ran on it: a custom autograd Function blocking in backward, an
   optimizer subclass blocking in step(), a DataLoader worker process stuck reading a sample, a lock-order
   deadlock in a forward hook, FSDP2 with one rank skipping its reduce-scatters, no_sync() accumulation with
   one rank's count off, DDP branches with and without find_unused_parameters, a compute straggler under
   FSDP2, a torch.save into storage that stopped accepting data vs rank 0 alone saving for 15 s, rank 0 alone
   evaluating for 25 s, DataLoader workers slow to open their shards, a 2 x 2 DeviceMesh (FSDP2 over dp,
   loss over tp) with one rank waiting forever, SIGSEGV, a rank that exits 0 early; later batches add a NaN-skipped
   batch, model.join(), loader worker errors, torch.compile, a batch_isend_irecv pipeline, an MoE all_to_all_single,
   activation checkpointing, clip_grad_norm_ under FSDP2, a DCP save and DDP evaluation under no_grad.
   `--first-run KEY --only NAMES` keeps a new batch's first run in bench/results/hang_new_first_run.json.
4. FR side by side: the FR dumps each scenario left (gloo, TORCH_FR_BUFFER_SIZE) analysed by
   `vigil diagnose` and by torch.distributed.flight_recorder.fr_trace, raw and with gloo's pg_config
   key repaired; which names the right culprit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vigil.diagnose.flight_recorder import (  # noqa: E402
    diagnose_dumps,
    normalize_for_torch,
    run_torch_analyzer,
)
from vigil.diagnose.hang import HangDiagnosis  # noqa: E402
from vigil.diagnose.stacks import merge_stacks  # noqa: E402
from vigil.model import VigilInputError  # noqa: E402
from vigil.run.launcher import free_port, launch  # noqa: E402

RESULTS = REPO / "bench" / "results"
FAULT_JOB = REPO / "tests" / "probe" / "fault_job.py"
TRAIN_JOB = REPO / "bench" / "jobs" / "train_small.py"
STACK_JOB = REPO / "tests" / "probe" / "stack_job.py"
NEW_JOB = REPO / "tests" / "probe" / "realistic_job.py"
WORLD = 3
console = Console()

class Scenario(NamedTuple):
    name: str
    args: list[str]
    verdict: str
    culprits: list[int]
    links: list[list[int]] = []
    world: int = WORLD
    # Set for a job hung before its first step: judged after this start-up allowance (else the default 60 s).
    startup_grace: float | None = None


SCENARIOS: list[Scenario] = [
    Scenario("stuck in compute", ["--fault", "compute", "--rank", "1"], "hang", [1]),
    Scenario("deadlock between threads", ["--fault", "deadlock", "--rank", "2"], "hang", [2]),
    Scenario("busy loop holding the GIL", ["--fault", "busyloop", "--rank", "1"], "hang", [1]),
    Scenario("C call holding the GIL", ["--fault", "gil", "--rank", "0"], "hang", [0]),
    Scenario("rank 0 stuck (reference-rank case)", ["--fault", "deadlock", "--rank", "0"], "hang", [0]),
    Scenario("skipped collective", ["--fault", "skip", "--rank", "1"], "mismatch", [1]),
    Scenario("mismatched shape", ["--fault", "shape", "--rank", "2"], "mismatch", [2]),
    Scenario("exception (CUDA error)", ["--fault", "exception", "--rank", "2"], "crash", [2]),
    Scenario("killed process", ["--fault", "kill", "--rank", "1"], "crash", [1]),
    Scenario("missing p2p recv in a ring", ["--fault", "p2p", "--rank", "2"], "hang", [2], [[1, 2]]),
    Scenario("straggler", ["--fault", "straggler", "--rank", "2", "--sleep", "0.3", "--steps", "16"], "slow", [2]),
    Scenario("slow but progressing", ["--fault", "slow", "--sleep", "1.5", "--steps", "8"], "ok", []),
    Scenario("long checkpoint save", ["--fault", "checkpoint", "--rank", "0", "--steps", "6"], "ok", []),
]

# Past this start-up allowance a job that never stepped is judged by every rank's stack (pre-step hangs).
PRE_STEP_GRACE_S = 10.0
# The stacks people train with (tests/probe/stack_job.py): DDP with the probe's Python comm hook, DDP with
# the built-in C++ hook (no collective passes through Python), FSDP2, hand-written collectives, functional
# collectives (on the world group, and on a DeviceMesh sub-group), and the c10d_functional operators a
# compiled graph calls (no Python collective API at all).
STACK_SCENARIOS: list[Scenario] = [
    *[Scenario(f"{stack}: rank stuck in forward", ["--stack", stack, "--fault", "forward", "--rank", "1"], "hang", [1])
      for stack in ("ddp", "fsdp", "ddp_builtin", "manual", "funcol")],
    Scenario("mesh (dp sub-group of a 2 x 2 DeviceMesh, 4 ranks): rank stuck in forward",
             ["--stack", "mesh", "--fault", "forward", "--rank", "1"], "hang", [1], world=4),
    Scenario("compiled_ops: rank stuck before the first step, no op recorded",
             ["--stack", "compiled_ops", "--fault", "forward", "--rank", "1", "--at-step", "0"], "hang", [1],
             startup_grace=PRE_STEP_GRACE_S),
    *[Scenario(f"{stack}: uneven inputs", ["--stack", stack, "--fault", "uneven", "--rank", "2"], "mismatch", [2])
      for stack in ("ddp", "fsdp")],
    *[Scenario(f"{stack}: straggler 0.6 s/step", ["--stack", stack, "--fault", "straggler", "--rank", "1"], "slow",
               [1]) for stack in ("ddp", "fsdp")],
    Scenario("fsdp: crash", ["--stack", "fsdp", "--fault", "crash", "--rank", "0"], "crash", [0]),
    Scenario("ddp: C call holding the GIL", ["--stack", "ddp", "--fault", "gil", "--rank", "2"], "hang", [2]),
    Scenario("fsdp: long checkpoint save", ["--stack", "fsdp", "--fault", "checkpoint", "--rank", "1", "--steps", "8"],
             "ok", []),
    Scenario("ddp: evaluation loop", ["--stack", "ddp", "--fault", "eval", "--rank", "1", "--steps", "8"], "ok", []),
    Scenario("ddp_builtin: slow data-loader warm-up", ["--stack", "ddp_builtin", "--fault", "warmup", "--rank", "1",
                                                       "--steps", "8"], "ok", []),
]
LONG_PAUSES = ("checkpoint", "eval", "warmup")


def _new(name: str, scenario: str, rank: int, verdict: str, culprits: list[int], *extra: str,
         world: int = WORLD, links: list[list[int]] | None = None) -> Scenario:
    return Scenario(name, ["--scenario", scenario, "--rank", str(rank), *extra], verdict, culprits, links or [],
                    world=world)


# New scenarios (tests/probe/realistic_job.py), their verdicts fixed before Vigil first ran on them. The long
# pauses that are no fault run for 15 s (the checkpoint) and 25 s (evaluation, warm-up) whatever the timeout.
NEW_SCENARIOS: list[Scenario] = [
    _new("ddp: custom autograd Function blocks in backward", "backward", 2, "hang", [2]),
    _new("ddp: optimizer subclass blocks in step()", "optimizer", 1, "hang", [1]),
    _new("ddp: DataLoader worker process stuck reading a sample", "loader_worker", 1, "hang", [1]),
    _new("ddp: lock-order deadlock in a forward pre-hook (rank 0)", "lock_hook", 0, "hang", [0]),
    _new("fsdp: one rank turns gradient sync off (skips its reduce-scatters)", "fsdp_skip_rs", 2, "mismatch", [2]),
    _new("ddp no_sync(): one rank accumulates 3 micro-batches, the others 2", "accum", 1, "mismatch", [1]),
    _new("ddp find_unused_parameters=True: one rank takes another branch", "unused_ok", 1, "ok", []),
    _new("ddp: one rank skips the auxiliary head (unused parameters)", "unused_crash", 1, "crash", [1]),
    _new("fsdp: compute straggler (~30 ms of a 0.13 s step)", "fsdp_straggler", 2, "slow", [2], "--steps", "16"),
    _new("ddp: torch.save into storage that stopped accepting data", "ckpt_stuck", 1, "hang", [1]),
    _new("ddp: rank 0 alone saves a checkpoint for 15 s", "ckpt_slow_ok", 0, "ok", [], "--sleep", "15"),
    _new("ddp: rank 0 alone evaluates for 25 s, the others at a barrier", "eval_ok", 0, "ok", [], "--sleep", "25"),
    _new("ddp: rank 0 alone evaluates for 25 s, its validation batches 3 s apart", "eval_slow_ok", 0, "ok", [],
         "--sleep", "25"),
    _new("ddp: DataLoader workers take 25 s to open their shards", "warmup_ok", 2, "ok", [], "--sleep", "25"),
    _new("mesh 2 x 2 (fsdp over dp, loss over tp): rank waits forever for a batch", "mesh_hang", 3, "hang", [3],
         world=4),
    _new("ddp: SIGSEGV in a native extension", "segv", 2, "crash", [2]),
    _new("ddp: one rank leaves the loop early and exits 0", "exit0", 1, "hang", [1]),
    # Written after the fix for the row above, to check its no-op-record path: not a first run.
    _new("ddp, built-in C++ hook (no op recorded): one rank exits 0 early", "exit0", 1, "hang", [1],
         "--builtin-hook"),
    # A second batch, written after the first fixes landed, each verdict fixed before it first ran.
    _new("ddp: one rank's loss is NaN once and it skips that batch", "nan_skip", 1, "mismatch", [1]),
    _new("ddp model.join(): one rank has 3 batches fewer (supported)", "join_ok", 2, "ok", []),
    _new("ddp: a DataLoader worker raises on a corrupt sample", "loader_crash", 1, "crash", [1]),
    _new("ddp: rank 0 waits forever before an all_gather_object of metrics", "gather_hang", 0, "hang", [0]),
    _new("ddp: a power iteration under no_grad that never converges", "ema_stuck", 2, "hang", [2]),
    # A third batch, written after the second batch's fixes landed, each verdict fixed before it first ran.
    _new("ddp + torch.compile (slow first compile): a rank rejection-samples a crop forever", "compile_hang", 1,
         "hang", [1]),
    _new("pipeline, batch_isend_irecv (4 stages): the last stage posts one recv too few", "pipe_short", 3,
         "hang", [3], world=4, links=[[2, 3]]),
    _new("moe all_to_all_single (4 ranks): rank 0's Sinkhorn routing never converges (NaN)", "moe_hang", 0,
         "hang", [0], world=4),
    _new("fsdp + activation checkpointing: recomputed forward blocks on a lock", "fsdp_ac_hang", 1, "hang", [1]),
    _new("ddp: a collate_fn with a 0.4 s round trip per batch", "collate_straggler", 2, "slow", [2],
         "--steps", "16"),
    _new("ddp: the OOM killer SIGKILLs a DataLoader worker", "oom_worker", 1, "crash", [1]),
    _new("ddp: a gradient guard hook raises in backward", "grad_hook_raise", 0, "crash", [0]),
    _new("fsdp clip_grad_norm_: one rank's loss-spike guard skips clip and step", "clip_skip", 2, "mismatch", [2]),
    _new("ddp: torch.distributed.checkpoint save, one rank writes for 15 s", "dcp_slow_ok", 0, "ok", [],
         "--sleep", "15"),
    _new("ddp: every rank evaluates the DDP model under no_grad, rank 0 for 25 s (4 ranks)", "eval_ddp_ok", 0,
         "ok", [], "--sleep", "25", world=4),
]


def run_scenarios(hang_timeout: float, work: Path, quick: bool, stacks: bool = False,
                  new: bool = False, only: set[str] | None = None) -> list[dict[str, Any]]:
    rows = []
    if new:
        scenarios = [s for s in NEW_SCENARIOS if only is None or s.args[1] in only]
        script = NEW_JOB
    elif stacks:
        scenarios, script = STACK_SCENARIOS, STACK_JOB
    else:
        scenarios, script = (SCENARIOS[:4] + SCENARIOS[9:10] if quick else SCENARIOS), FAULT_JOB
    for index, (name, args, verdict, culprits, links, world, startup_grace) in enumerate(scenarios):
        if not new and any(pause in args for pause in LONG_PAUSES):
            args = [*args, "--sleep", str(2.5 * hang_timeout)]
        out = work / f"scenario{index}"
        console.log(f"scenario: {name}")
        start = time.time()
        diagnosis = launch(script, args, nproc=world, hang_timeout=hang_timeout, out_dir=out,
                           startup_grace=startup_grace or 60.0)
        wall = time.time() - start
        correct = diagnosis.verdict == verdict and diagnosis.culprit_ranks == culprits
        if links:
            correct = correct and diagnosis.culprit_links == links
        latency = diagnosis.detected_after_s
        rows.append({
            "scenario": name,
            "world_size": world,
            "expected_verdict": verdict,
            "verdict": diagnosis.verdict,
            "expected_culprits": culprits,
            "culprit_ranks": diagnosis.culprit_ranks,
            "culprit_links": diagnosis.culprit_links,
            "hang_kind": diagnosis.hang_kind,
            "fork_point": diagnosis.fork_point.frame if diagnosis.fork_point else None,
            "correct": correct,
            "detected_after_s": latency,
            # A job that never stepped is judged after its start-up allowance, not the hang timeout.
            "within_budget": latency is None or latency <= max(hang_timeout, startup_grace or 0.0) + 5.0,
            "wall_s": round(wall, 1),
            "fr_dir": str(out / "fr") if (out / "fr").is_dir() else None,
            "summary": diagnosis.summary,
        })
    return rows


def start_nodes(out: Path, hang_timeout: float, job_args: list[str], launch_args: tuple[str, ...] = (),
                node_names: tuple[str, str] | None = None) -> list[subprocess.Popen[str]]:
    """Two `vigil launch` processes as two nodes of one job (torchrun-style static rendezvous), 2 ranks each,
    sharing ``out``; ``node_names`` name the two machines (VIGIL_NODE_NAME) where both run on this one."""
    port = str(free_port())
    return [
        subprocess.Popen(
            [sys.executable, "-m", "vigil", "launch", "script", str(STACK_JOB), "--nproc-per-node", "2",
             "--nnodes", "2", "--node-rank", str(node), "--master-port", port, "--hang-timeout", str(hang_timeout),
             "--out", str(out), "--json", *launch_args, "--", *job_args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
            env=dict(os.environ, VIGIL_NODE_NAME=node_names[node]) if node_names else None,
        )
        for node in (0, 1)
    ]


def finish_nodes(nodes: list[subprocess.Popen[str]]) -> list[str]:
    """Each launcher's output; a launcher still running when this ends (a failure) is killed, by its pid."""
    try:
        return [node.communicate(timeout=600)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()


def run_two_nodes(hang_timeout: float, work: Path) -> dict[str, Any]:
    """One FSDP2 job on two "nodes" (2 ranks each); rank 2, on node 1, stuck in forward: both node
    supervisors must name it."""
    name = "fsdp, 2 nodes x 2 ranks: rank stuck in forward (on node 1)"
    console.log(f"scenario: {name}")
    start = time.time()
    outputs = finish_nodes(start_nodes(work / "two_nodes", hang_timeout,
                                       ["--stack", "fsdp", "--fault", "forward", "--rank", "2"]))
    wall = time.time() - start
    verdicts = [HangDiagnosis.model_validate_json(text) for text in outputs]
    agree = all((v.verdict, v.culprit_ranks) == (verdicts[0].verdict, verdicts[0].culprit_ranks) for v in verdicts)
    latency = max((v.detected_after_s for v in verdicts if v.detected_after_s is not None), default=None)
    first = verdicts[0]
    return {
        "scenario": name, "world_size": 4, "expected_verdict": "hang", "verdict": first.verdict,
        "expected_culprits": [2], "culprit_ranks": first.culprit_ranks, "culprit_links": first.culprit_links,
        "hang_kind": first.hang_kind, "fork_point": first.fork_point.frame if first.fork_point else None,
        "nodes_agree": agree, "correct": agree and (first.verdict, first.culprit_ranks) == ("hang", [2]),
        "detected_after_s": latency, "within_budget": latency is not None and latency <= hang_timeout + 5.0,
        "wall_s": round(wall, 1),
    }


def measure_periodic_stacks(work: Path) -> dict[str, Any]:
    """Periodic py-spy sweeps (--stack-period 1) of two two-node DDP jobs on "machines" node-a and node-b; in
    both the rank that lags every step lives on node-b. `vigil stacks` must flag node-b and not node-a."""
    console.log("periodic stacks: two two-node DDP jobs with a slow rank on node-b")
    runs = []
    start = time.time()
    for name, slow in (("first", "2"), ("second", "3")):
        out = work / "periodic" / name
        nodes = start_nodes(out, 30.0, ["--stack", "ddp", "--fault", "straggler", "--rank", slow, "--steps",
                                        "24", "--sleep", "0.5"], launch_args=("--stack-period", "1"),
                            node_names=("node-a", "node-b"))
        finish_nodes(nodes)
        runs.append(str(out))
    report = json.loads(subprocess.run([sys.executable, "-m", "vigil", "stacks", *runs, "--json"], cwd=REPO,
                                       capture_output=True, text=True, timeout=300, check=True).stdout)
    jobs = []
    for job, slow_rank in zip(report["jobs"], (2, 3), strict=True):
        counts = {int(rank): n for rank, n in job["outlier_counts"].items()}
        top = max(counts, key=lambda rank: counts[rank]) if counts else -1
        jobs.append({"slow_rank": slow_rank, "sweeps": job["sweeps"], "outlier_counts": counts, "top_outlier": top,
                     "right": top == slow_rank and 2 * counts[top] > job["sweeps"]})
    machines = {m["host"]: {"flagged": m["flagged"], "outlier_jobs": m["outlier_jobs"]} for m in report["machines"]}
    return {"jobs": jobs, "machines": machines, "wall_s": round(time.time() - start, 1),
            "right": all(j["right"] for j in jobs) and machines.get("node-b", {}).get("flagged") is True
            and not machines.get("node-a", {}).get("flagged")}


def plain_run(script: Path, args: list[str], nproc: int, log_dir: Path) -> None:
    """The baseline: the same ranks with torchrun's environment and no probe."""
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.pop("TORCH_FR_BUFFER_SIZE", None)
        with open(log_dir / f"plain{rank}.log", "wb") as log:
            procs.append(subprocess.Popen([sys.executable, str(script), *args], env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
    try:
        for proc in procs:
            if proc.wait(timeout=600) != 0:
                raise RuntimeError(f"baseline job failed, see {log_dir}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def measure_overhead(work: Path, rounds: int, steps: int, block: int = 20) -> dict[str, Any]:
    """Primary: the probe's hooks toggled every ``block`` steps inside the same job (same processes, same
    load). Secondary: whole runs with and without the probe and its supervisor, alternating."""
    on_steps: list[float] = []
    off_steps: list[float] = []
    on_cpu: list[float] = []
    off_cpu: list[float] = []
    pair_ratios: list[float] = []
    for round_index in range(rounds):
        result = work / f"toggle_{round_index}.json"
        diagnosis = launch(TRAIN_JOB, ["--steps", str(steps), "--result", str(result), "--toggle-probe", str(block)],
                           nproc=2, hang_timeout=10.0, out_dir=work / "toggle_run", flight_recorder=False)
        if diagnosis.verdict != "ok":
            raise RuntimeError(f"overhead job ended {diagnosis.verdict}: {diagnosis.summary}")
        data = json.loads(result.read_text())
        on, off = data["on_step_s"], data["off_step_s"]
        on_steps += on
        off_steps += off
        on_cpu += data["on_cpu_s"]
        off_cpu += data["off_cpu_s"]
        for index in range(min(len(on), len(off)) // block):
            window = slice(index * block, (index + 1) * block)
            pair_ratios.append(statistics.median(on[window]) / statistics.median(off[window]))
        console.log(f"overhead round {round_index}: hooks on {statistics.median(on) * 1000:.2f} ms, "
                    f"off {statistics.median(off) * 1000:.2f} ms per step")
    separate_off, separate_on = [], []
    for round_index in range(rounds):
        for arm in ("off", "on"):
            result = work / f"separate_{arm}_{round_index}.json"
            args = ["--steps", str(steps // 2), "--result", str(result)]
            if arm == "off":
                plain_run(TRAIN_JOB, args, 2, work)
            else:
                launch(TRAIN_JOB, args, nproc=2, hang_timeout=10.0, out_dir=work / "separate_run",
                       flight_recorder=False)
            step = json.loads(result.read_text())["median_step_s"]
            (separate_off if arm == "off" else separate_on).append(step)
    on_median, off_median = statistics.median(on_steps), statistics.median(off_steps)
    return {
        "method": f"hooks toggled every {block} steps in the same 2-rank gloo job, {rounds} run(s) of {steps} steps",
        "probe_on_median_step_ms": round(on_median * 1000, 3),
        "probe_off_median_step_ms": round(off_median * 1000, 3),
        "overhead_pct": round((on_median / off_median - 1.0) * 100, 2),
        "paired_block_overhead_pct": round((statistics.median(pair_ratios) - 1.0) * 100, 2),
        "probe_on_median_cpu_ms": round(statistics.median(on_cpu) * 1000, 3),
        "probe_off_median_cpu_ms": round(statistics.median(off_cpu) * 1000, 3),
        "cpu_overhead_pct": round((statistics.median(on_cpu) / statistics.median(off_cpu) - 1.0) * 100, 2),
        "block_pairs": len(pair_ratios),
        "separate_runs": {
            "method": "whole runs alternating: plain processes vs vigil launch (probe + supervisor)",
            "off_median_step_ms": round(statistics.median(separate_off) * 1000, 3),
            "on_median_step_ms": round(statistics.median(separate_on) * 1000, 3),
            "overhead_pct": round((statistics.median(separate_on) / statistics.median(separate_off) - 1) * 100, 2),
        },
    }


def measure_op_cost(calls: int = 5000) -> dict[str, Any]:
    """The probe's own cost per op: an all_reduce of 1,000 floats in a one-rank gloo group, hooked vs
    not, alternating blocks; independent of how many ops a step has."""
    import torch
    import torch.distributed as dist

    from vigil.sources.probe.hooks import install_hooks, uninstall_hooks
    from vigil.sources.probe.probe import Probe

    with tempfile.TemporaryDirectory(prefix="vigil-bench-op-") as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(f"{tmp}/store", 1), rank=0, world_size=1)
        probe = Probe(rank=0, world_size=1, out_dir=Path(tmp))
        tensor = torch.ones(1000)
        on: list[float] = []
        off: list[float] = []
        try:
            for block in range(10):
                if block % 2 == 0:
                    install_hooks(probe)
                else:
                    uninstall_hooks()
                start = time.perf_counter()
                for _ in range(calls // 10):
                    dist.all_reduce(tensor)
                (on if block % 2 == 0 else off).append((time.perf_counter() - start) / (calls // 10))
        finally:
            uninstall_hooks()
            dist.destroy_process_group()
    return {"all_reduce_unhooked_us": round(statistics.median(off) * 1e6, 2),
            "all_reduce_hooked_us": round(statistics.median(on) * 1e6, 2),
            "probe_cost_per_op_us": round((statistics.median(on) - statistics.median(off)) * 1e6, 2)}


def measure_ddp_hook_cost(steps: int = 400) -> dict[str, Any]:
    """What the probe adds to a DDP training step (forward, backward, SGD step): the Python all_reduce comm
    hook it installs, the recorded op, and the compute marks; against DDP's built-in C++ hook without the probe, in
    alternating blocks in one one-rank gloo process (same load for both arms)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from vigil.sources.probe.hooks import install_hooks, uninstall_hooks
    from vigil.sources.probe.probe import Probe

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="vigil-bench-ddp-") as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(f"{tmp}/store", 1), rank=0, world_size=1)
        probe = Probe(rank=0, world_size=1, out_dir=Path(tmp))

        def net() -> torch.nn.Module:
            return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))

        plain = DistributedDataParallel(net())
        plain._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        install_hooks(probe)
        probed = DistributedDataParallel(net())
        batch = torch.randn(64, 256)
        optimizers = {id(m): torch.optim.SGD(m.parameters(), lr=1e-3) for m in (plain, probed)}
        on: list[float] = []
        off: list[float] = []
        try:
            for block in range(10):
                if block % 2 == 0:
                    install_hooks(probe)
                else:
                    uninstall_hooks()
                model = probed if block % 2 == 0 else plain
                start = time.perf_counter()
                for _ in range(steps // 10):
                    model(batch).pow(2).mean().backward()
                    optimizers[id(model)].step()
                (on if block % 2 == 0 else off).append((time.perf_counter() - start) / (steps // 10))
        finally:
            uninstall_hooks()
            dist.destroy_process_group()
    ops = probe.ring.total
    return {"ddp_step_builtin_hook_ms": round(statistics.median(off) * 1e3, 3),
            "ddp_step_probed_ms": round(statistics.median(on) * 1e3, 3),
            "overhead_pct": round((statistics.median(on) / statistics.median(off) - 1) * 100, 2),
            "ops_recorded": ops}


def measure_stack_merge(ranks: int = 10_000, repeats: int = 5) -> dict[str, Any]:
    common = ["<module> (train.py:300)", "main (train.py:250)", "train (train.py:200)", "step (train.py:120)"]
    stacks = {}
    for rank in range(ranks):
        if rank in (17, 4243):
            main = [*common, "load_batch (data.py:40)", "acquire (threading.py:320)"]
        elif rank % 97 == 0:
            main = [*common, "backward (autograd/__init__.py:266)"]
        else:
            main = [*common, f"all_reduce (distributed/distributed_c10d.py:{3200 + rank % 40})"]
        stacks[rank] = {"MainThread": main, "pin_memory": ["_bootstrap (threading.py:1002)", "run (pin.py:10)"]}
    times = []
    fork = None
    for _ in range(repeats):
        start = time.perf_counter()
        fork = merge_stacks(stacks).fork_points()[0]
        times.append(time.perf_counter() - start)
    assert fork is not None
    return {"ranks": ranks, "median_s": round(statistics.median(times), 4), "max_s": round(max(times), 4),
            "fork_ranks_found": len(fork.ranks), "fork_frame": fork.frame}


def compare_with_torch(rows: list[dict[str, Any]], work: Path) -> list[dict[str, Any]]:
    comparisons = []
    for row in rows:
        fr_dir = row.get("fr_dir")
        if not fr_dir or not any(Path(fr_dir).iterdir()) or row["expected_verdict"] in ("ok", "slow"):
            continue
        expected = row["expected_culprits"]
        try:
            ours = diagnose_dumps(Path(fr_dir), world_size=WORLD)
            ours_culprits, ours_note = ours.culprit_ranks, ours.verdict
        except VigilInputError as err:
            ours_culprits, ours_note = [], f"error: {err}"
        raw = run_torch_analyzer(Path(fr_dir), "rank_")
        fixed_dir = work / f"normalized_{len(comparisons)}"
        normalize_for_torch(Path(fr_dir), fixed_dir)
        fixed = run_torch_analyzer(fixed_dir, "rank_")
        torch_fixed = sorted(set(fixed.culprit_ranks) | set(fixed.missing_ranks))
        torch_raw = sorted(set(raw.culprit_ranks) | set(raw.missing_ranks))
        comparisons.append({
            "scenario": row["scenario"],
            "expected": expected,
            "dumps": len(list(Path(fr_dir).iterdir())),
            "vigil_fr": ours_culprits,
            "vigil_fr_verdict": ours_note,
            "vigil_fr_correct": ours_culprits == expected,
            "vigil_probe_correct": row["correct"],
            "torch_raw": torch_raw if raw.ok else "fails (KeyError on gloo pg_config)",
            "torch_raw_correct": raw.ok and torch_raw == expected,
            "torch_normalized": torch_fixed,
            "torch_normalized_correct": torch_fixed == expected,
        })
    return comparisons


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hang-timeout", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="5 scenarios, 1 overhead round")
    parser.add_argument("--overhead-rounds", type=int, default=3)
    parser.add_argument("--overhead-only", action="store_true", help="print the overhead measurement only")
    parser.add_argument("--overhead-steps", type=int, default=200)
    parser.add_argument("--stacks-only", action="store_true",
                        help="only the DDP / FSDP2 scenarios and the DDP hook cost; merged into hang.json")
    parser.add_argument("--new-only", action="store_true",
                        help="only the new scenarios (tests/probe/realistic_job.py); merged into hang.json")
    parser.add_argument("--first-run", metavar="KEY",
                        help="with --only: the first run of new scenarios, kept under KEY in hang_new_first_run.json")
    parser.add_argument("--only", help="comma-separated realistic_job.py --scenario names (with --first-run)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vigil-bench-hang-") as tmp:
        work = Path(tmp)
        if args.first_run:
            if not args.only:
                parser.error("--first-run needs --only")
            record_first_run(args.first_run, set(args.only.split(",")), args.hang_timeout, work)
            return
        if args.new_only:
            run_new(args.hang_timeout, work)
            return
        if args.stacks_only:
            run_stacks(args.hang_timeout, work)
            return
        if args.overhead_only:
            console.print_json(data={**measure_overhead(work, args.overhead_rounds, args.overhead_steps),
                                     "per_op": measure_op_cost()})
            return
        rows = run_scenarios(args.hang_timeout, work, args.quick)
        stack_rows = [*run_scenarios(args.hang_timeout, work / "stacks", args.quick, stacks=True),
                      run_two_nodes(args.hang_timeout, work)]
        new_rows = run_scenarios(args.hang_timeout, work / "new", args.quick, new=True)
        periodic = measure_periodic_stacks(work)
        comparisons = compare_with_torch(rows, work)
        overhead = measure_overhead(work, 1 if args.quick else args.overhead_rounds, args.overhead_steps)
    merge = measure_stack_merge()
    overhead["per_op"] = measure_op_cost()
    # Robust to machine load: what the probe adds per op, times the job's ops per step, over its step time.
    ops_per_step = 5
    overhead["estimated_overhead_pct"] = round(
        overhead["per_op"]["probe_cost_per_op_us"] * ops_per_step / (overhead["probe_off_median_step_ms"] * 1000) * 100,
        3,
    )
    for row in rows:
        row.pop("fr_dir", None)
    latencies = [r["detected_after_s"] for r in rows if r["expected_verdict"] in ("hang", "mismatch", "crash")
                 and r["detected_after_s"] is not None]
    result = {
        "hang_timeout_s": args.hang_timeout,
        "world_size": WORLD,
        "scenarios": rows,
        "culprit_accuracy": round(sum(r["correct"] for r in rows) / len(rows), 3),
        "max_detection_latency_s": max(latencies) if latencies else None,
        "all_within_budget": all(r["within_budget"] for r in rows),
        "stack_scenarios": stack_summary(stack_rows),
        "new_scenarios": new_summary(new_rows, args.hang_timeout),
        "periodic_stacks": periodic,
        "overhead": overhead,
        "ddp_hook_cost": measure_ddp_hook_cost(),
        "stack_merge": merge,
        "flight_recorder_side_by_side": comparisons,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "hang.json").write_text(json.dumps(result, indent=1))
    show(result)


def stack_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    for row in rows:
        row.pop("fr_dir", None)
    return {"world_size": WORLD, "scenarios": rows,
            "correct": sum(r["correct"] for r in rows), "total": len(rows),
            "all_within_budget": all(r["within_budget"] for r in rows)}


def run_stacks(hang_timeout: float, work: Path) -> None:
    """The DDP / FSDP2 scenarios and the DDP hook cost, merged into an existing hang.json."""
    (work / "stacks").mkdir()
    summary = stack_summary([*run_scenarios(hang_timeout, work / "stacks", False, stacks=True),
                             run_two_nodes(hang_timeout, work)])
    path = RESULTS / "hang.json"
    result = json.loads(path.read_text()) if path.exists() else {"hang_timeout_s": hang_timeout}
    result["stack_scenarios"] = {**summary, "hang_timeout_s": hang_timeout}
    result["periodic_stacks"] = measure_periodic_stacks(work)
    result["ddp_hook_cost"] = measure_ddp_hook_cost()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    show_stacks(result)


def record_first_run(key: str, only: set[str], hang_timeout: float, work: Path) -> None:
    """New scenarios' first run (their verdicts were fixed in NEW_SCENARIOS before it), kept under ``key`` in
    hang_new_first_run.json beside the earlier batches."""
    (work / "new").mkdir()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=False).stdout.strip()
    rows = run_scenarios(hang_timeout, work / "new", False, new=True, only=only)
    kept = []
    for row in rows:
        row.pop("fr_dir", None)
        spec = next(s for s in NEW_SCENARIOS if s.name == row["scenario"])
        kept.append({"scenario": spec.args[1], "description": row["scenario"], "world_size": row["world_size"],
                     "faulty_rank": int(spec.args[3]), **{k: v for k, v in row.items()
                                                        if k not in ("scenario", "world_size")}})
    path = RESULTS / "hang_new_first_run.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    result[key] = {
        "what": f"{len(rows)} scenarios, verdicts fixed before they first ran (Vigil {commit})",
        "vigil_commit": commit, "hang_timeout_s": hang_timeout,
        "correct": sum(r["correct"] and r["within_budget"] for r in rows), "total": len(rows), "scenarios": kept,
    }
    path.write_text(json.dumps(result, indent=1))
    show_new({"new_scenarios": new_summary(rows, hang_timeout)})


def new_summary(rows: list[dict[str, Any]], hang_timeout: float) -> dict[str, Any]:
    for row in rows:
        row.pop("fr_dir", None)
    return {"hang_timeout_s": hang_timeout, "scenarios": rows, "correct": sum(r["correct"] for r in rows),
            "total": len(rows), "all_within_budget": all(r["within_budget"] for r in rows)}


def run_new(hang_timeout: float, work: Path) -> None:
    """The new scenarios alone, merged into an existing hang.json."""
    (work / "new").mkdir()
    summary = new_summary(run_scenarios(hang_timeout, work / "new", False, new=True), hang_timeout)
    path = RESULTS / "hang.json"
    result = json.loads(path.read_text()) if path.exists() else {"hang_timeout_s": hang_timeout}
    result["new_scenarios"] = summary
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    show_new(result)


def show_new(result: dict[str, Any]) -> None:
    new = result["new_scenarios"]
    table = Table(title="New scenarios (tests/probe/realistic_job.py, gloo, "
                        f"--hang-timeout {new['hang_timeout_s']:g} s)")
    for column in ("scenario", "ranks", "verdict", "culprit", "expected", "detected after (s)", "wall (s)", "ok"):
        table.add_column(column)
    for row in new["scenarios"]:
        latency = "" if row["detected_after_s"] is None else f"{row['detected_after_s']:.1f}"
        table.add_row(row["scenario"], str(row["world_size"]), f"{row['verdict']} ({row['expected_verdict']})",
                      str(row["culprit_ranks"]), str(row["expected_culprits"]), latency, f"{row['wall_s']:.0f}",
                      "yes" if row["correct"] and row["within_budget"] else "NO")
    console.print(table)
    console.print(f"{new['correct']}/{new['total']} right, all within the hang timeout + 5 s: "
                  f"{new['all_within_budget']}")


def show_stacks(result: dict[str, Any]) -> None:
    stacks = result["stack_scenarios"]
    table = Table(title=f"DDP / FSDP2 / hand-written scenarios ({stacks['world_size']} gloo ranks, "
                        f"--hang-timeout {stacks.get('hang_timeout_s', result['hang_timeout_s']):g} s)")
    for column in ("scenario", "verdict", "culprit", "expected", "detected after (s)", "wall (s)", "ok"):
        table.add_column(column)
    for row in stacks["scenarios"]:
        latency = "" if row["detected_after_s"] is None else f"{row['detected_after_s']:.1f}"
        table.add_row(row["scenario"], row["verdict"], str(row["culprit_ranks"]), str(row["expected_culprits"]),
                      latency, f"{row['wall_s']:.0f}", "yes" if row["correct"] else "NO")
    console.print(table)
    periodic = result.get("periodic_stacks")
    if periodic:
        console.print(f"periodic stacks: node-b flagged {periodic['machines'].get('node-b', {}).get('flagged')}, "
                      f"node-a flagged {periodic['machines'].get('node-a', {}).get('flagged')}; per job "
                      + ", ".join(f"slow rank {j['slow_rank']}: top outlier {j['top_outlier']} "
                                  f"({j['outlier_counts'].get(j['top_outlier'], 0)} of {j['sweeps']} sweeps)"
                                  for j in periodic["jobs"]) + (" - right" if periodic["right"] else " - WRONG"))
    cost = result["ddp_hook_cost"]
    console.print(f"{stacks['correct']}/{stacks['total']} right; DDP step {cost['ddp_step_probed_ms']} ms probed vs "
                  f"{cost['ddp_step_builtin_hook_ms']} ms built-in hook, no probe ({cost['overhead_pct']:+.2f}%)")


def show(result: dict[str, Any]) -> None:
    table = Table(title=f"hang scenarios (3 gloo ranks, --hang-timeout {result['hang_timeout_s']:g} s)")
    for column in ("scenario", "verdict", "culprit", "expected", "kind", "detected after (s)", "ok"):
        table.add_column(column)
    for row in result["scenarios"]:
        latency = "" if row["detected_after_s"] is None else f"{row['detected_after_s']:.1f}"
        table.add_row(row["scenario"], row["verdict"], str(row["culprit_ranks"]), str(row["expected_culprits"]),
                      str(row["hang_kind"] or ""), latency, "yes" if row["correct"] else "NO")
    console.print(table)
    console.print(f"culprit accuracy {result['culprit_accuracy']:.0%}, max detection latency "
                  f"{result['max_detection_latency_s']} s")
    overhead = result["overhead"]
    console.print(f"probe overhead: {overhead['probe_on_median_step_ms']} ms vs {overhead['probe_off_median_step_ms']}"
                  f" ms per step = {overhead['overhead_pct']:+.2f}% (paired blocks "
                  f"{overhead['paired_block_overhead_pct']:+.2f}%; CPU time {overhead['cpu_overhead_pct']:+.2f}%; "
                  f"separate runs {overhead['separate_runs']['overhead_pct']:+.2f}%; "
                  f"{overhead['per_op']['probe_cost_per_op_us']} us per op -> estimated "
                  f"{overhead['estimated_overhead_pct']:.2f}%)")
    merge = result["stack_merge"]
    console.print(f"stack merge of {merge['ranks']:,} ranks: median {merge['median_s']} s")
    side = Table(title="Flight Recorder dumps: who names the right culprit")
    for column in ("scenario", "expected", "vigil (FR only)", "vigil (probe)", "torch raw", "torch repaired"):
        side.add_column(column)
    for row in result["flight_recorder_side_by_side"]:
        vigil_fr = f"{row['vigil_fr']} {'ok' if row['vigil_fr_correct'] else 'x'}"
        side.add_row(row["scenario"], str(row["expected"]), vigil_fr,
                     "ok" if row["vigil_probe_correct"] else "x", str(row["torch_raw"]),
                     f"{row['torch_normalized']} {'ok' if row['torch_normalized_correct'] else 'x'}")
    console.print(side)
    if "stack_scenarios" in result:
        show_stacks(result)
    if "new_scenarios" in result:
        show_new(result)


if __name__ == "__main__":
    main()
