"""Periodic stacks clustered across ranks, and across jobs on one machine.

While a job runs, its supervisor takes every rank's py-spy stack at a bounded rate (``--stack-period``)
and appends one *sweep* to ``stacks.periodic[.node<I>].jsonl``: per rank its host and its main-thread
stack signature (functions outermost first, line numbers dropped, so ranks in the same loop iteration
at different lines stay together). Read back, the ranks of one sweep fall into clusters of equal
signature; when one cluster holds a strict majority of the ranks, the others are that sweep's
outliers.

Across jobs: a machine whose ranks are outliers in most sweeps of every job it ran (at least two jobs,
each spanning more than one machine) is flagged - a bad machine shows in every job, a bad job on one
machine does not. No threshold is fitted: "most" is more than half.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vigil.diagnose.stacks import MAIN_THREAD, RankStacks, function_of
from vigil.model import VigilInputError

PERIODIC_GLOB = "stacks.periodic*.jsonl"
# Frames kept per signature, innermost last: enough to tell a data loader from a collective.
SIGNATURE_FRAMES = 12


def periodic_file(node_rank: int | None) -> str:
    return "stacks.periodic.jsonl" if node_rank is None else f"stacks.periodic.node{node_rank}.jsonl"


def signature(threads: dict[str, list[str]]) -> list[str]:
    """A rank's main-thread stack as functions without line numbers, the innermost SIGNATURE_FRAMES."""
    return [function_of(frame)[0] for frame in threads.get(MAIN_THREAD, [])][-SIGNATURE_FRAMES:]


@dataclass
class StackSweep:
    """One look at a job's ranks (on one node: the others write their own lines of the same index)."""

    job: str
    index: int
    ts: float
    hosts: dict[int, str]
    signatures: dict[int, list[str]]

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "index": self.index, "ts": self.ts,
                "ranks": {str(r): {"host": self.hosts.get(r, "?"), "signature": s}
                          for r, s in sorted(self.signatures.items())}}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> StackSweep:
        try:
            ranks = data["ranks"]
            return cls(
                job=str(data["job"]), index=int(data["index"]), ts=float(data["ts"]),
                hosts={int(r): str(v["host"]) for r, v in ranks.items()},
                signatures={int(r): [str(f) for f in v["signature"]] for r, v in ranks.items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise VigilInputError(
                f"{where}: expected a sweep {{job, index, ts, ranks: {{rank: {{host, signature}}}}}} ({err})"
            ) from None


def sweep_of(stacks: RankStacks, hosts: dict[int, str], job: str, index: int, ts: float) -> StackSweep:
    return StackSweep(job=job, index=index, ts=ts, hosts={r: hosts.get(r, "?") for r in stacks},
                      signatures={r: signature(t) for r, t in stacks.items()})


def append_sweep(path: Path, sweep: StackSweep) -> None:
    with open(path, "a") as out:
        out.write(json.dumps(sweep.to_dict()) + "\n")


def read_sweeps(run_dir: Path) -> list[StackSweep]:
    """Every node's sweeps of one run, the lines of equal index merged into one sweep of the whole job."""
    if not run_dir.is_dir():
        raise VigilInputError(f"{run_dir} is not a run directory")
    merged: dict[int, StackSweep] = {}
    for path in sorted(run_dir.glob(PERIODIC_GLOB)):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as err:
                raise VigilInputError(f"{path}:{number}: not JSON ({err.msg})") from None
            sweep = StackSweep.from_dict(data, f"{path}:{number}")
            into = merged.setdefault(sweep.index, StackSweep(sweep.job, sweep.index, sweep.ts, {}, {}))
            into.hosts.update(sweep.hosts)
            into.signatures.update(sweep.signatures)
            into.ts = min(into.ts, sweep.ts)
    return [merged[i] for i in sorted(merged)]


@dataclass
class StackCluster:
    ranks: list[int]
    top: str
    signature: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "top": self.top, "signature": self.signature}


def clusters(sweep: StackSweep) -> list[StackCluster]:
    """Ranks of equal signature, largest cluster first."""
    groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for rank, frames in sweep.signatures.items():
        groups[tuple(frames)].append(rank)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), min(item[1])))
    return [StackCluster(sorted(ranks), frames[-1] if frames else "?", list(frames)) for frames, ranks in ordered]


def outliers(sweep: StackSweep) -> list[int]:
    """The ranks outside the majority cluster; none when no cluster holds a strict majority."""
    found = clusters(sweep)
    if not found or 2 * len(found[0].ranks) <= len(sweep.signatures):
        return []
    return sorted(r for c in found[1:] for r in c.ranks)


@dataclass
class JobStacks:
    """One run's sweeps, clustered."""

    run_dir: str
    job: str
    sweeps: int
    outlier_counts: dict[int, int]
    hosts: dict[int, str]
    latest: list[StackCluster] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"run_dir": self.run_dir, "job": self.job, "sweeps": self.sweeps,
                "outlier_counts": {str(r): n for r, n in sorted(self.outlier_counts.items())},
                "hosts": {str(r): h for r, h in sorted(self.hosts.items())},
                "latest_clusters": [c.to_dict() for c in self.latest]}


def job_stacks(run_dir: Path) -> JobStacks:
    sweeps = read_sweeps(run_dir)
    counts: Counter[int] = Counter()
    hosts: dict[int, str] = {}
    for sweep in sweeps:
        counts.update(outliers(sweep))
        hosts.update(sweep.hosts)
    return JobStacks(str(run_dir), sweeps[0].job if sweeps else "?", len(sweeps), dict(counts), hosts,
                     clusters(sweeps[-1]) if sweeps else [])


@dataclass
class MachineFinding:
    host: str
    jobs: int
    outlier_jobs: int
    flagged: bool

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "jobs": self.jobs, "outlier_jobs": self.outlier_jobs, "flagged": self.flagged}


def machine_findings(jobs: list[JobStacks]) -> list[MachineFinding]:
    """Per machine: in how many of the multi-machine jobs it ran its ranks were outliers in more than half
    of the sweeps; flagged when that is every one of at least two jobs."""
    seen: Counter[str] = Counter()
    outlying: Counter[str] = Counter()
    for job in jobs:
        machines = set(job.hosts.values())
        if len(machines) < 2 or job.sweeps == 0:
            continue
        for host in machines:
            seen[host] += 1
            ranks = [r for r, h in job.hosts.items() if h == host]
            if any(2 * job.outlier_counts.get(r, 0) > job.sweeps for r in ranks):
                outlying[host] += 1
    return sorted(
        (MachineFinding(host, seen[host], outlying[host], seen[host] >= 2 and outlying[host] == seen[host])
         for host in seen),
        key=lambda f: (not f.flagged, -f.outlier_jobs, f.host),
    )
