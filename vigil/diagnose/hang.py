"""The hang / crash / mismatch / straggler verdict of a distributed job, with culprit and evidence.

Inputs are what the probe, the supervisor and the launcher leave behind (``RunEvidence``); the same
function serves the live supervisor and ``vigil diagnose DIR`` after the fact.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vigil.detect.collectives import CollectiveFinding, match_collectives
from vigil.detect.hang import stuck_checkpoint_s
from vigil.diagnose.crash import RankFailure, describe_exit, error_from_log, root_failure
from vigil.diagnose.p2p import P2PAnalysis, analyse, states_from_probe
from vigil.diagnose.stacks import ForkPoint, RankStacks, StackTree, collective_split, load_stacks, merge_stacks
from vigil.diagnose.straggler import find_straggler, first_step_end, median_step_s
from vigil.model import (
    HANG_EXIT_CODES,
    Evidence,
    HangDiagnosis,
    HangKind,
    HangVerdict,
    RankStatus,
    StackClass,
    StackFork,
    VigilInputError,
    rank_id,
)
from vigil.sources.probe.records import (
    DEFAULT_HANG_TIMEOUT_S,
    DIAGNOSIS_FILE,
    RUN_FILE,
    STACKS_FILE,
    OpRecord,
    RankSnapshot,
    read_rank,
    read_snapshot,
)

Verdict = HangVerdict
# A rank whose probe heartbeat is older than this cannot run Python: it holds the GIL or is frozen.
STALE_HEARTBEAT_S = 2.0
# A rank that computed within this many seconds of the verdict is still computing.
RECENT_COMPUTE_S = 1.0
EXIT_CODES = HANG_EXIT_CODES


@dataclass
class RunEvidence:
    """Everything known about a run at the moment of the verdict."""

    world_size: int
    snapshots: dict[int, RankSnapshot] = field(default_factory=dict)
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    exit_times: dict[int, float] = field(default_factory=dict)
    stopped_by_supervisor: set[int] = field(default_factory=set)
    logs: dict[int, str] = field(default_factory=dict)
    stacks: RankStacks = field(default_factory=dict)
    stack_source: str = "none"
    trigger: str | None = None
    detected_at: float = field(default_factory=time.time)
    heartbeat_ages: dict[int, float] = field(default_factory=dict)
    hang_timeout_s: float = DEFAULT_HANG_TIMEOUT_S
    job: str = "local"
    # rank -> innermost C / C++ frames (py-spy --native) of a rank frozen inside native code
    native: dict[int, list[str]] = field(default_factory=dict)

    def ops_by_rank(self) -> dict[int, list[OpRecord]]:
        return {rank: snap.ops for rank, snap in self.snapshots.items()}

    def last_progress(self) -> float | None:
        if not self.snapshots:
            return None
        return max(snap.last_progress() for snap in self.snapshots.values())


# ----------------------------------------------------------------------------- verdict


def diagnose(run: RunEvidence) -> HangDiagnosis:
    ops = run.ops_by_rank()
    findings = match_collectives(ops, run.detected_at)
    mismatch = next((f for f in findings if f.mismatched), None)
    failures = _failures(run)
    tree = merge_stacks(run.stacks) if run.stacks else None
    forks = tree.fork_points() if tree is not None else []
    left = _left_early(run, failures)
    if left is not None:
        diag = _left_job(run, failures, left)
    elif failures:
        diag = _crash(run, failures, mismatch)
    elif run.trigger in ("hang", "mismatch") or mismatch is not None:
        diag = _hang(run, findings, mismatch, forks, tree)
    else:
        diag = _finished(run, ops)
    diag.job = run.job
    diag.world_size = run.world_size
    diag.stack_source = run.stack_source
    last = run.last_progress()
    if diag.verdict not in ("ok", "slow") and last is not None:
        diag.detected_after_s = round(max(0.0, run.detected_at - last), 3)
    if diag.fork_point is None and diag.verdict != "ok":
        fork = _pick_fork(tree, forks, diag.culprit_ranks)
        diag.fork_point = StackFork.model_validate(fork.to_dict()) if fork is not None else None
    diag.ranks = _rank_table(run, findings, tree)
    diag.stacks = {r: t["MainThread"] for r, t in sorted(run.stacks.items()) if t.get("MainThread")}
    if tree is not None:
        diag.stack_classes = [
            StackClass(ranks=ranks, main_top=(threads.get("MainThread") or ["?"])[-1])
            for ranks, threads in tree.classes[:8]
        ]
    _add_rank_evidence(run, diag)
    return diag


def _failures(run: RunEvidence) -> list[RankFailure]:
    failures = []
    for rank, raised in sorted(run.snapshots.items()):
        # Raised, but never exited: the process hangs in interpreter shutdown (gloo teardown, a
        # non-daemon thread). The exception is still the failure.
        code = run.exit_codes.get(rank)
        still_there = code is None or rank in run.stopped_by_supervisor
        if raised.error is not None and still_there:
            failures.append(RankFailure(rank, float(raised.error["ts"]), str(raised.error["type"]),
                                        str(raised.error["message"]), None))
    for rank, code in sorted(run.exit_codes.items()):
        if code is None or code == 0 or rank in run.stopped_by_supervisor:
            continue
        snap = run.snapshots.get(rank)
        ts = run.exit_times.get(rank, run.detected_at)
        if snap is not None and snap.error is not None:
            failures.append(RankFailure(rank, float(snap.error["ts"]), str(snap.error["type"]),
                                        str(snap.error["message"]), code))
            continue
        from_log = error_from_log(run.logs.get(rank, ""))
        if code < 0 and (from_log is None or code == -9):
            failures.append(RankFailure(rank, ts, "killed", describe_exit(code), code))
        elif from_log is not None:
            failures.append(RankFailure(rank, ts, from_log[0], from_log[1], code))
        else:
            failures.append(RankFailure(rank, ts, "exit", describe_exit(code), code))
    return failures


def _left_early(
    run: RunEvidence, failures: list[RankFailure]
) -> tuple[list[int], CollectiveFinding | None] | None:
    """A rank whose script ended cleanly (an early return, a wrong loop bound) while its peers waited in a
    collective it never entered: the peers' errors (a closed connection) are its consequence, not a crash.
    Needs every failure to be a cascade symptom and the ranks that left to have finished before the first of
    them; with op records, those ranks must be the ones missing from the collective the others entered (a
    job whose ranks all reached the end and then failed in teardown is not this), without any (a C++ comm
    hook), finishing first is the evidence."""
    if not failures or any(not f.is_cascade for f in failures):
        return None
    first = min(f.ts for f in failures)
    with_ops = any(snap.ops for snap in run.snapshots.values())
    # When it ended: its last op record's start where there are records - the last snapshot is written at exit,
    # after the script's own destroy_process_group() closed the connections its peers then failed on (seconds
    # after them on a loaded machine); the heartbeat of that last write where there are none.
    ended = {
        r for r, snap in run.snapshots.items()
        if snap.finished and snap.error is None and run.exit_codes.get(r) in (0, None)
        and (max((op.t_start for op in snap.ops), default=snap.started) if with_ops else snap.heartbeat) <= first
    }
    if not ended or ended & {f.rank for f in failures}:
        return None
    if with_ops:
        # A rank whose script ended has nothing in flight: an op its last record still shows unfinished (the
        # end of a collective read from the Flight Recorder ring that the exit overtook) was over for it.
        ops = {r: [replace(op, state="completed") if r in ended and op.in_flight else op for op in snap.ops]
               for r, snap in run.snapshots.items()}
        for finding in match_collectives(ops, run.detected_at):
            missing = set(finding.missing)
            if missing and missing <= ended and finding.waiting:
                return sorted(missing), finding
        return None
    return sorted(ended), None


def _left_job(
    run: RunEvidence, failures: list[RankFailure], left: tuple[list[int], CollectiveFinding | None]
) -> HangDiagnosis:
    culprits, finding = left
    how = f"rank(s) {culprits} ended their script (exit status 0)"
    if finding is not None:
        how += (f" without entering {finding.op} #{finding.seq} of group {finding.group!r}, where rank(s) "
                f"{finding.waiting} waited")
        attrs: dict[str, Any] = {"group": finding.group, "seq": finding.seq}
    else:
        how += f" before rank(s) {sorted({f.rank for f in failures})} failed, every error a consequence"
        attrs = {}
    first = min(failures, key=lambda f: f.ts)
    return HangDiagnosis(
        verdict="hang",
        culprit_ranks=culprits,
        hang_kind="not_enqueued",
        summary=f"hang: {how}; their errors followed ({first.describe()[:200]})",
        evidence=[_evidence(run, culprits[0], how, left_early=True, **attrs),
                  *[_evidence(run, f.rank, f.describe(), failure=f.to_dict()) for f in failures]],
    )


def _crash(run: RunEvidence, failures: list[RankFailure], mismatch: CollectiveFinding | None) -> HangDiagnosis:
    root = root_failure(failures)
    assert root is not None
    cascade = [f.rank for f in failures if f is not root]
    evidence = [_evidence(run, f.rank, f.describe(), failure=f.to_dict()) for f in failures]
    if mismatch is not None:
        culprits = sorted(mismatch.mismatched)
        how = "skipped a collective" if mismatch.skipped else "disagree with the others on the collective"
        return HangDiagnosis(
            verdict="mismatch",
            culprit_ranks=culprits,
            hang_kind="signature_mismatch",
            root_error=root.describe(),
            summary=f"mismatch: rank(s) {culprits} {how}: {mismatch.describe()}; the job crashed "
            f"({root.describe()})",
            evidence=[_evidence(run, culprits[0], mismatch.describe(), skipped=mismatch.skipped), *evidence],
        )
    kind: HangKind | None = "process_dead" if root.kind == "killed" else None
    tail = f"; ranks {cascade} failed after it" if cascade else ""
    return HangDiagnosis(
        verdict="crash",
        culprit_ranks=[root.rank],
        hang_kind=kind,
        root_error=root.describe(),
        summary=f"crash: {root.describe()}{tail}",
        evidence=evidence,
    )


def _hang(
    run: RunEvidence,
    findings: list[CollectiveFinding],
    mismatch: CollectiveFinding | None,
    forks: list[ForkPoint],
    tree: StackTree | None,
) -> HangDiagnosis:
    evidence = [_evidence(run, _first_rank(f), f.describe(), group=f.group, seq=f.seq) for f in findings]
    if mismatch is not None and not mismatch.missing:
        return HangDiagnosis(
            verdict="mismatch",
            culprit_ranks=sorted(mismatch.mismatched),
            hang_kind="signature_mismatch",
            summary=f"mismatch: {mismatch.describe()}",
            evidence=evidence,
        )
    p2p = analyse(states_from_probe(run.ops_by_rank()))
    stale = sorted(r for r, age in run.heartbeat_ages.items() if age > STALE_HEARTBEAT_S)
    primary = findings[0] if findings else None
    culprits: list[int]
    kind: HangKind
    if p2p.links and _p2p_explains(p2p, primary):
        culprits, kind = p2p.culprit_ranks, "p2p"
        what = "; ".join(link.reason for link in p2p.links)
        evidence += [_evidence(run, link.culprit if link.culprit is not None else link.src, link.reason,
                               **link.to_dict()) for link in p2p.links]
        summary = f"hang in point-to-point traffic: {what}"
    elif primary is not None and primary.missing:
        culprits, kind = primary.missing, "not_enqueued"
        summary = (
            f"hang: rank(s) {primary.missing} never entered {primary.op} #{primary.seq} of group "
            f"{primary.group!r}; {len(primary.waiting)} rank(s) waited {primary.oldest_wait_s:.1f} s"
        )
    elif primary is not None:
        odd = [r for r in primary.waiting if r in stale] or _fork_ranks(forks, primary.waiting)
        culprits, kind = odd, "stuck_in_collective"
        summary = f"hang inside {primary.op} #{primary.seq} of group {primary.group!r}: every rank entered it"
    else:
        computing = _computing_alone(run)
        split = collective_split(run.stacks) if run.stacks else None
        elsewhere = split[1] if split is not None else []
        culprits = stale or elsewhere or computing or _fork_ranks(forks, sorted(run.snapshots))
        kind = "not_enqueued"
        summary = "hang: no step and no communication progress, and no collective in flight that the probe saw"
        if split is not None and not stale:
            summary += f"; rank(s) {split[0]} wait in a collective, rank(s) {elsewhere} never entered it"
        if computing and not stale:
            summary += f"; rank(s) {computing} still compute while the others wait"
    fork = _pick_fork(tree, forks, culprits)
    if fork is not None:
        summary += f"; culprit stack leaves the others at {fork.frame}"
    return HangDiagnosis(
        verdict="hang",
        culprit_ranks=sorted(culprits),
        hang_kind=kind,
        culprit_links=p2p.culprit_links if kind == "p2p" else [],
        fork_point=StackFork.model_validate(fork.to_dict()) if fork is not None else None,
        summary=summary,
        evidence=evidence,
    )


def _computing_alone(run: RunEvidence) -> list[int]:
    """Ranks that computed just before the verdict while every other rank sat idle: the others wait
    for them (stuck in compute), even when the collective they wait in left no record."""
    recent = {
        r for r, s in run.snapshots.items()
        if s.last_compute is not None and run.detected_at - s.last_compute < RECENT_COMPUTE_S
    }
    return sorted(recent) if 0 < len(recent) < len(run.snapshots) else []


def _p2p_explains(p2p: P2PAnalysis, primary: CollectiveFinding | None) -> bool:
    """P2P findings win when the ranks missing from the collective are the ones blocked in p2p."""
    if primary is None or not primary.missing:
        return True
    return all(rank in p2p.waiting or rank in p2p.culprit_ranks for rank in primary.missing)


def _finished(run: RunEvidence, ops: dict[int, list[OpRecord]]) -> HangDiagnosis:
    straggler = find_straggler(ops, step_s=median_step_s([s.step_times for s in run.snapshots.values()]),
                               since=first_step_end(run.snapshots.values()))
    if straggler is None:
        return HangDiagnosis(verdict="ok", summary="ok: every rank finished")
    return HangDiagnosis(
        verdict="slow",
        culprit_ranks=[straggler.rank],
        summary=f"slow: {straggler.describe()}",
        evidence=[_evidence(run, straggler.rank, straggler.describe(), last_share=straggler.last_share,
                            median_lag_s=straggler.median_lag_s, wait_by_rank=straggler.wait_by_rank)],
    )


def _fork_ranks(forks: list[ForkPoint], among: list[int]) -> list[int]:
    for fork in forks:
        odd = [r for r in fork.ranks if r in among]
        if odd:
            return odd
    return []


def _pick_fork(tree: StackTree | None, forks: list[ForkPoint], culprits: list[int]) -> ForkPoint | None:
    """The fork the culprit takes: where its main-thread stack leaves every other rank's; else the first fork
    the culprit is on; none when the culprit's stacks look like everyone else's (a rank that skipped a p2p
    op waits in the same collective as its healthy peers)."""
    if not culprits:
        return forks[0] if forks else None
    own = tree.fork_of(set(culprits)) if tree is not None else None
    if own is not None:
        return own
    for fork in forks:
        if set(fork.ranks) & set(culprits):
            return fork
    return None


def _first_rank(finding: CollectiveFinding) -> int:
    return (finding.missing or finding.waiting or finding.members or [0])[0]


def _evidence(run: RunEvidence, rank: int, summary: str, **attrs: Any) -> Evidence:
    return Evidence(kind="hang", entity=rank_id(run.job, rank), ts=run.detected_at, summary=summary[:4000],
                    attrs=attrs)


def _rank_table(run: RunEvidence, findings: list[CollectiveFinding], tree: StackTree | None) -> list[RankStatus]:
    rows = []
    for rank in range(run.world_size):
        snap = run.snapshots.get(rank)
        in_flight = [op for op in snap.ops if op.in_flight] if snap else []
        code = run.exit_codes.get(rank)
        if code is not None and rank not in run.stopped_by_supervisor:
            state = "finished" if code == 0 else describe_exit(code)
        elif run.heartbeat_ages.get(rank, 0.0) > STALE_HEARTBEAT_S:
            state = "frozen (holds the GIL)"
        elif in_flight:
            state = "in communication"
        elif snap is not None and snap.activity.get("kind") == "checkpoint":
            state = "saving checkpoint"
        elif snap is not None and snap.last_compute and run.detected_at - snap.last_compute < RECENT_COMPUTE_S:
            state = "in compute"
        else:
            state = "outside communication"
        top = None
        threads = run.stacks.get(rank)
        if threads and threads.get("MainThread"):
            top = threads["MainThread"][-1]
        waits = [d for op in (snap.ops if snap else []) if (d := op.duration_s) is not None]
        rows.append(
            RankStatus(
                rank=rank,
                state=state,
                op=f"{in_flight[-1].op} #{in_flight[-1].seq}" if in_flight else None,
                heartbeat_age_s=round(run.heartbeat_ages[rank], 2) if rank in run.heartbeat_ages else None,
                exit_code=code,
                top_frame=top,
                median_step_s=round(statistics.median(snap.step_times), 4) if snap and snap.step_times else None,
                mean_comm_wait_s=round(statistics.fmean(waits), 4) if waits else None,
            )
        )
    return rows


def _add_rank_evidence(run: RunEvidence, diag: HangDiagnosis) -> None:
    for rank in diag.culprit_ranks:
        age = run.heartbeat_ages.get(rank)
        if age is not None and age > STALE_HEARTBEAT_S:
            diag.evidence.append(_evidence(
                run, rank,
                f"rank {rank}'s probe heartbeat stopped {age:.1f} s before the verdict: the process "
                "holds the GIL (stuck in C code) or is frozen", heartbeat_age_s=age))
        native = run.native.get(rank)
        if native:
            diag.evidence.append(_evidence(
                run, rank, f"rank {rank} is inside native code: " + " <- ".join(native), native_frames=native))
        threads = run.stacks.get(rank)
        others = [t for r, t in run.stacks.items() if r not in diag.culprit_ranks]
        only_here = sorted(name for name in threads or {} if others and all(name not in t for t in others))
        if threads and only_here:
            described = ", ".join(f"{name} at {threads[name][-1] if threads[name] else '?'}" for name in only_here)
            diag.evidence.append(_evidence(
                run, rank, f"threads only rank {rank} has: {described}", threads={n: threads[n] for n in only_here}))
        if threads and threads.get("MainThread"):
            diag.evidence.append(_evidence(
                run, rank, f"rank {rank} main thread ({run.stack_source}): "
                + " <- ".join(reversed(threads["MainThread"][-6:])), frames=threads["MainThread"]))
        snap = run.snapshots.get(rank)
        quiet = stuck_checkpoint_s(snap, run.detected_at) if snap is not None else None
        if snap is not None and quiet is not None:
            diag.evidence.append(_evidence(
                run, rank, f"rank {rank} is inside a checkpoint save ({snap.activity.get('name', 'save')}) that has "
                f"written nothing for {quiet:.1f} s ({int(snap.activity.get('written', 0))} bytes since it began): "
                "the storage stopped accepting data", checkpoint=snap.activity))
        if snap is not None and snap.last_compute and run.detected_at - snap.last_compute < RECENT_COMPUTE_S:
            diag.evidence.append(_evidence(
                run, rank, f"rank {rank} is still computing ({snap.compute_calls} matmul calls) but not "
                "communicating: stuck in compute", compute_calls=snap.compute_calls))


# ----------------------------------------------------------------------------- on disk


def load_run(directory: Path) -> RunEvidence:
    """Rebuild the evidence of a `vigil launch` run directory (or a probe directory of a torchrun job)."""
    if not directory.is_dir():
        raise VigilInputError(f"{directory} is not a directory")
    meta: dict[str, Any] = {}
    run_file = directory / RUN_FILE
    if run_file.exists():
        try:
            meta = json.loads(run_file.read_text())
        except json.JSONDecodeError as err:
            raise VigilInputError(f"{run_file} is not valid JSON: {err.msg} at line {err.lineno}") from None
        if not isinstance(meta, dict):
            raise VigilInputError(f"{run_file}: expected a JSON object")
    snapshots = {}
    for path in sorted(directory.glob("rank*.json")):
        rank = read_snapshot(path).rank
        snapshots[rank] = read_rank(directory, rank)
    if not snapshots:
        raise VigilInputError(f"{directory} holds no rank<R>.json probe snapshots and no run.json")
    world = int(meta.get("world_size") or max(s.world_size for s in snapshots.values()))
    detected_at = float(meta.get("detected_at") or max(s.heartbeat for s in snapshots.values()))
    stacks: RankStacks = {}
    stack_source = "none"
    if (directory / STACKS_FILE).exists():
        stacks = load_stacks(directory / STACKS_FILE)
        stack_source = str(meta.get("stack_source", "py-spy"))
    else:
        from vigil.diagnose.stacks import from_python_stacks

        stacks = {r: from_python_stacks(s.stacks) for r, s in snapshots.items() if s.stacks}
        stack_source = "probe" if stacks else "none"
    logs = {}
    for rank in range(world):
        log = directory / f"rank{rank}.log"
        if log.exists():
            logs[rank] = log.read_text(errors="replace")[-20000:]
    heartbeat_ages = {r: max(0.0, detected_at - s.heartbeat) for r, s in snapshots.items() if not s.finished}
    trigger = meta.get("trigger")
    if trigger is None and any(s.stalled for s in snapshots.values()):
        trigger = "hang"
    return RunEvidence(
        world_size=world,
        snapshots=snapshots,
        exit_codes={int(k): v for k, v in meta.get("exit_codes", {}).items()},
        exit_times={int(k): float(v) for k, v in meta.get("exit_times", {}).items()},
        stopped_by_supervisor=set(meta.get("stopped_by_supervisor", [])),
        logs=logs,
        stacks=stacks,
        stack_source=stack_source,
        trigger=trigger,
        detected_at=detected_at,
        heartbeat_ages={int(k): float(v) for k, v in meta.get("heartbeat_ages", {}).items()} or heartbeat_ages,
        hang_timeout_s=float(meta.get("hang_timeout_s", DEFAULT_HANG_TIMEOUT_S)),
        job=str(meta.get("job", "local")),
        native={int(k): [str(f) for f in v] for k, v in meta.get("native_frames", {}).items()},
    )


def write_diagnosis(directory: Path, diag: HangDiagnosis) -> Path:
    path = directory / DIAGNOSIS_FILE
    path.write_text(diag.model_dump_json(indent=2))
    return path
