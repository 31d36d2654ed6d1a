"""Slurm jobs as Slurm reports them: ``squeue`` for the jobs and their states, ``scontrol show hostnames`` to
expand node lists, ``scontrol show job`` for exit codes and restarts. Works without accounting (no sacct).

Each read gives the jobs (id, name, state, nodes, restart count) and, for a job that newly reached a failed
state (FAILED, NODE_FAIL, TIMEOUT, OUT_OF_MEMORY), one ``job`` event with ``reason=crashed`` - what the
rules read as a job crash. Placement (rank -> GPU) follows Slurm's block distribution: ranks fill a node's
GPUs in index order, then the next node's.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from vigil.model import Event, FaultLevel, Job, Topology, VigilInputError, job_id
from vigil.sources.collect.base import Collection, Source

FAILED_STATES = frozenset({"FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})
SQUEUE_FORMAT = "%i|%j|%T|%N|%r"
# one Key=Value field of ``scontrol show job -o``'s single line; a value with spaces in it (a Comment, a Command's
# arguments) is cut at the first one, so Comment is read by _COMMENT
_JOB_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=(\S*)")
_COMMENT = re.compile(r"\bComment=(.*?)(?= [A-Z][A-Za-z]+=|$)")


def job_fields(text: str) -> dict[str, str]:
    """The fields of ``scontrol show job J -o`` (JobState, Requeue, Restarts, ExitCode, NodeList, ...); ``(null)``
    is read as empty, and a field named twice keeps its first value (a Comment or Command that reads
    ``Requeue=0`` does not override Slurm's own)."""
    fields: dict[str, str] = {}
    for key, value in _JOB_FIELD.findall(text):
        fields.setdefault(key, "" if value == "(null)" else value)
    return fields


@dataclass(frozen=True)
class SlurmJob:
    id: str
    name: str
    state: str
    nodes: tuple[str, ...]
    reason: str

    @property
    def failed(self) -> bool:
        return self.state in FAILED_STATES


class SlurmJobs(Source):
    name = "slurm"
    kind = "kube"  # read on the scheduler's (slow) interval

    def __init__(self, squeue: str = "squeue", scontrol: str = "scontrol", timeout_s: float = 30.0) -> None:
        super().__init__()
        self.squeue = squeue
        self.scontrol = scontrol
        self.timeout_s = timeout_s
        self._states: dict[str, str] = {}

    def _run(self, argv: list[str]) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        except FileNotFoundError:
            raise VigilInputError(f"{argv[0]} is not installed or not on PATH") from None
        except subprocess.TimeoutExpired:
            raise VigilInputError(f"{' '.join(argv[:2])} did not answer within {self.timeout_s:g} s") from None
        if done.returncode != 0:
            raise VigilInputError(f"{' '.join(argv[:2])} failed ({done.returncode}): {done.stderr.strip()[:300]}")
        return done.stdout

    def jobs(self) -> list[SlurmJob]:
        """Every job Slurm still remembers (running, pending and recently finished)."""
        out = []
        for line in self._run([self.squeue, "-h", "-t", "all", "-o", SQUEUE_FORMAT]).splitlines():
            parts = line.split("|")
            if len(parts) != 5:
                self.problems.report("unexpected squeue line", line)
                continue
            job, name, state, nodelist, reason = parts
            out.append(SlurmJob(job, name, state, self.hostnames(nodelist), reason))
        return out

    def hostnames(self, nodelist: str) -> tuple[str, ...]:
        nodelist = nodelist.strip()
        if not nodelist or nodelist.startswith("("):
            return ()
        return tuple(self._run([self.scontrol, "show", "hostnames", nodelist]).split())

    def details(self, job: str) -> dict[str, str]:
        """ExitCode, Restarts, Requeue and Comment of one job from ``scontrol show job -o``."""
        text = self._run([self.scontrol, "show", "job", job, "-o"])
        fields = job_fields(text)
        found: dict[str, str] = {key: fields[key] for key in ("ExitCode", "Restarts", "Requeue") if key in fields}
        comment = _COMMENT.search(text)
        if comment and comment.group(1) != "(null)":
            found["Comment"] = comment.group(1)
        return found

    def collect(self, now: float) -> Collection:
        out = Collection(status=f"squeue ({self.squeue})")
        for job in self.jobs():
            previous = self._states.get(job.id)
            self._states[job.id] = job.state
            if job.failed and previous != job.state:
                detail = self.details(job.id)
                out.events.append(Event(
                    ts=now, entity=job_id(job.id), kind="job", source="slurm", level=FaultLevel.DRAIN,
                    message=f"Slurm job {job.id} ({job.name}) {job.state} on {','.join(job.nodes) or 'no node'}",
                    attrs={"reason": "crashed", "state": job.state, "exit_reason": f"{job.state} "
                           f"exit code {detail.get('ExitCode', '?')}", "restarts": int(detail.get("Restarts", 0)),
                           "comment": detail.get("Comment", ""), "nodes": list(job.nodes)}))
        return out


def placement(job: SlurmJob, topology: Topology) -> Job:
    """The job in Vigil's topology: one rank per GPU of its nodes, block-distributed as Slurm places tasks."""
    gpus = []
    for name in job.nodes:
        try:
            node = topology.node(name)
        except KeyError:
            continue
        gpus += [g.id for g in sorted(node.gpus, key=lambda g: g.index)]
    return Job(id=job.id, name=job.name, placement=gpus)
