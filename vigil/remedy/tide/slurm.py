"""The tiers on Slurm: one QOS per tier, preemption by QOS with requeue, and the running jobs of each tier.

- QOS ``<tier name>`` (``online-inference``, ...), Priority 1000 / 750 / 500 / 250 for tiers 1-4;
- tiers 1 and 2 preempt tiers 3 and 4, tier 3 preempts tier 4 (``Preempt=``); tiers 3 and 4 are requeued
  when preempted (``PreemptMode=requeue``) after their grace period (``GraceTime=``, Slurm's SIGTERM then
  requeue); a tier's ceiling is the QOS's ``GrpTRES=gres/gpu=N``;
- slurm.conf needs ``PreemptType=preempt/qos``, ``PreemptMode=REQUEUE``, ``JobRequeue=1`` and accounting
  (slurmdbd), since QOS live in the accounting database.

A job belongs to the tier whose QOS it runs under, or else to the tier whose workload globs its name matches.
"""

from __future__ import annotations

import re

from vigil.model import VigilInputError
from vigil.remedy.actuators.base import ActuatorError, run_command
from vigil.remedy.tide.act import TierJob
from vigil.remedy.tide.tiers import TierPolicy

SLURM_CONF_LINES = ("PreemptType=preempt/qos", "PreemptMode=REQUEUE", "JobRequeue=1",
                    "AccountingStorageEnforce=associations,limits,qos")
PRIORITY = {1: 1000, 2: 750, 3: 500, 4: 250}
PREEMPTS = {1: (3, 4), 2: (3, 4), 3: (4,), 4: ()}
SQUEUE_FORMAT = "%i|%j|%q|%S|%D|%C|%b"
_GPUS = re.compile(r"gpu(?::[A-Za-z0-9_.-]+)?[:=](\d+)")


def qos_names(policy: TierPolicy) -> dict[int, str]:
    return {t.tier: t.name for t in policy.tiers}


def qos_commands(policy: TierPolicy, tres: str = "gres/gpu") -> list[list[str]]:
    """``sacctmgr`` command lines that create each tier's QOS (tier 4 first: a QOS may preempt only QOS that exist)."""
    names = qos_names(policy)
    commands = []
    for tier in sorted(policy.tiers, key=lambda t: -t.tier):
        settings = [f"Priority={PRIORITY[tier.tier]}", f"GrpTRES={tres}={tier.ceiling_gpus}"]
        if PREEMPTS[tier.tier]:
            settings.append("Preempt=" + ",".join(names[n] for n in PREEMPTS[tier.tier]))
        if tier.preemptible:
            settings += ["PreemptMode=requeue", f"GraceTime={int(tier.grace_period_s)}"]
        commands.append(["sacctmgr", "-i", "add", "qos", tier.name, *settings])
    return commands


def _units(tres: str, nodes: str, cpus: str, per_node: str) -> int:
    if tres == "cpu":
        return int(cpus)
    match = _GPUS.search(per_node)
    return int(match.group(1)) * int(nodes) if match else 0


class SlurmJobsUnreadable(VigilInputError):
    """``squeue`` is missing or failed: which jobs run is unknown (not a malformed answer, which is an error)."""


def running_tier_jobs(policy: TierPolicy, tres: str = "gres/gpu", squeue: str = "squeue",
                      timeout_s: float = 30.0) -> list[TierJob]:
    """The running jobs of tiers 3 and 4, from ``squeue``: GPUs per node x nodes (or CPUs when ``tres`` is cpu)."""
    try:
        out = run_command([squeue, "-h", "-t", "RUNNING", "-o", SQUEUE_FORMAT], timeout_s, "squeue").stdout
    except ActuatorError as err:
        raise SlurmJobsUnreadable(f"cannot list Slurm jobs: {err}") from None
    by_qos = {name: tier for tier, name in qos_names(policy).items()}
    jobs = []
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) != 7 or not parts[4].isdigit() or not parts[5].isdigit():
            raise VigilInputError(f"unexpected squeue line {line!r}: expected {SQUEUE_FORMAT}")
        job, name, qos, started, nodes, cpus, per_node = parts
        tier = by_qos.get(qos) or policy.tier_of(name)
        if tier in (3, 4):
            jobs.append(TierJob(job, name, tier, _units(tres, nodes, cpus, per_node), started))
    return jobs
