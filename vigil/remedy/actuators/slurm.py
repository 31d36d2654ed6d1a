"""Slurm actuator: ``scontrol`` on the PATH (or a given path).

- cordon / drain: ``scontrol update nodename=N state=drain reason="vigil: ..."``. Slurm's DRAIN lets
  running jobs finish and schedules nothing new, which is Kubernetes' cordon + allow-completion drain.
- uncordon: ``scontrol update nodename=N state=resume``.
- reboot: ``scontrol reboot ASAP nextstate=resume reason="..." N`` (reboots once the node is idle).
- restart_job: ``scontrol requeue J`` (a failed or running batch job goes back to the queue; Slurm counts
  it in the job's Restarts).
- migrate_job: off its bad nodes - ``params.nodes`` (``node/N`` ids) plus the job's nodes Slurm already holds
  drained or down: each named node not yet drained is drained, then ``scontrol requeuehold J``, ``scontrol
  update jobid=J excnodelist=...`` (the job's own exclusions kept) and ``scontrol release J``, so the job
  restarts from its last checkpoint on other nodes. A pending job is only updated. A job Slurm will not
  requeue (``Requeue=0`` in ``scontrol show job``, or not a batch job) is refused before anything runs.
- preempt_notice: ``scancel --signal=USR1 --full J`` - a tidal preemption notice: the job (batch script and
  steps) gets the signal and writes its checkpoint before its capacity is taken back.
- preempt: ``scontrol requeue J`` - a preemptible job gives its capacity back and waits in the queue.
- set_quota: ``sacctmgr -i modify qos where name=Q set GrpTRES=gres/gpu=N`` - a tier's QOS may hold at
  most N GPUs (``params``: queue, resource, units).

Idempotence reads ``scontrol show node N -o``: a node whose State already carries DRAIN is not
drained again. Tests run the commands against a real one-node Slurm (tests/remedy/test_slurm_real.py) and
against a fake ``scontrol`` on PATH that records its calls and answers with recorded output.
"""

from __future__ import annotations

import re

from vigil.model import Action, ActionKind, parse_entity
from vigil.remedy.actuators.base import Actuator, ActuatorError, migration_nodes, run_command
from vigil.sources.collect.slurm import job_fields

_STATE = re.compile(r"\bState=(\S+)")
_QOS_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_TRES_NAME = re.compile(r"^(cpu|mem|node|billing|gres/[a-z0-9_.:-]{1,40})$")
# the signals a job may be told to checkpoint on (SIGKILL / SIGSTOP would not be a notice)
NOTICE_SIGNALS = frozenset({"USR1", "USR2", "TERM", "INT", "URG"})
# a COMPLETING job is already giving its capacity back
_RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING"})
_SAFE_REASON = re.compile(r"[^A-Za-z0-9 _.,:/=()\-]")
# node states whose jobs must move: the node no longer takes work, or is gone
_OUT_STATES = ("DRAIN", "DOWN", "FAIL")
# requeuehold's mark on the job it holds; a migration cut short there is resumed, not requeued twice
_REQUEUE_HELD = "job_requeued_in_held_state"


class SlurmActuator(Actuator):
    name = "slurm"
    kinds = frozenset({ActionKind.CORDON, ActionKind.DRAIN, ActionKind.UNCORDON, ActionKind.REBOOT,
                       ActionKind.RESTART_JOB, ActionKind.MIGRATE_JOB, ActionKind.PREEMPT_NOTICE, ActionKind.PREEMPT,
                       ActionKind.SET_QUOTA})
    target_kinds = frozenset({"node", "job", "cluster"})
    job_kinds = frozenset({ActionKind.RESTART_JOB, ActionKind.MIGRATE_JOB, ActionKind.PREEMPT_NOTICE,
                           ActionKind.PREEMPT})

    def accepts(self, action: Action) -> bool:
        kind = parse_entity(action.target)[0]
        if action.kind in self.job_kinds:
            return kind == "job"
        if action.kind is ActionKind.SET_QUOTA:
            return kind == "cluster"
        return action.kind in self.kinds and kind == "node"

    def __init__(
        self,
        scontrol: str = "scontrol",
        timeout_s: float = 30.0,
        *,
        scancel: str = "scancel",
        squeue: str = "squeue",
        sacctmgr: str = "sacctmgr",
    ) -> None:
        self.scontrol = scontrol
        self.scancel = scancel
        self.squeue = squeue
        self.sacctmgr = sacctmgr
        self.timeout_s = timeout_s

    @staticmethod
    def reason(action: Action) -> str:
        # Slurm stores the reason verbatim; keep it short and free of quotes / shell metacharacters.
        return ("vigil: " + _SAFE_REASON.sub("_", action.reason))[:200]

    def command(self, action: Action) -> list[str]:
        node = parse_entity(action.target)[1][0]
        if action.kind in (ActionKind.RESTART_JOB, ActionKind.PREEMPT):
            return [self.scontrol, "requeue", node]
        if action.kind is ActionKind.PREEMPT_NOTICE:
            return [self.scancel, f"--signal={self.notice_signal(action)}", "--full", node]
        if action.kind is ActionKind.SET_QUOTA:
            qos, tres, units = self.quota(action)
            return [self.sacctmgr, "-i", "modify", "qos", "where", f"name={qos}", "set", f"GrpTRES={tres}={units}"]
        if action.kind in (ActionKind.CORDON, ActionKind.DRAIN):
            return [
                self.scontrol,
                "update",
                f"nodename={node}",
                "state=drain",
                f"reason={self.reason(action)}",
            ]
        if action.kind is ActionKind.UNCORDON:
            return [self.scontrol, "update", f"nodename={node}", "state=resume"]
        if action.kind is ActionKind.REBOOT:
            return [
                self.scontrol,
                "reboot",
                "ASAP",
                "nextstate=resume",
                f"reason={self.reason(action)}",
                node,
            ]
        raise ActuatorError(f"slurm actuator cannot {action.kind.value}")

    @staticmethod
    def notice_signal(action: Action) -> str:
        signal = str(action.params.get("signal", "USR1")).upper().removeprefix("SIG")
        if signal not in NOTICE_SIGNALS:
            raise ActuatorError(f"notice signal {signal!r} is not one of {', '.join(sorted(NOTICE_SIGNALS))}")
        return signal

    @staticmethod
    def quota(action: Action) -> tuple[str, str, int]:
        """The QOS, TRES and limit of a set_quota action, checked: they go onto sacctmgr's command line."""
        qos, tres, units = (action.params.get("queue"), action.params.get("resource", "gres/gpu"),
                           action.params.get("units"))
        if not isinstance(qos, str) or not _QOS_NAME.match(qos):
            raise ActuatorError(f"set_quota needs params.queue, a QOS name, got {qos!r}")
        if not isinstance(tres, str) or not _TRES_NAME.match(tres):
            raise ActuatorError(f"set_quota params.resource must be cpu, node or gres/<name>, got {tres!r}")
        if not isinstance(units, int) or isinstance(units, bool) or units < 0:
            raise ActuatorError(f"set_quota needs params.units, a count of at least 0, got {units!r}")
        if action.params.get("flavor") is not None:
            raise ActuatorError("a Slurm QOS's GrpTRES has no flavors; params.flavor (--flavor) is for a Kueue "
                                "ClusterQueue")
        return qos, tres, units

    def job_state(self, job: str) -> str:
        return self._run([self.squeue, "-h", "-j", job, "-o", "%T"]).strip()

    def qos_limit(self, qos: str) -> str:
        return self._run([self.sacctmgr, "-n", "-P", "show", "qos", f"name={qos}", "format=GrpTRES"]).strip()

    def describe(self, action: Action) -> str:
        if action.kind is ActionKind.MIGRATE_JOB:
            return self.describe_migration(action)
        return "run " + " ".join(self.command(action))

    def _run(self, argv: list[str]) -> str:
        return run_command(argv, self.timeout_s, " ".join(argv[:3])).stdout

    def node_state(self, node: str) -> str:
        match = _STATE.search(self._run([self.scontrol, "show", "node", node, "-o"]))
        return match.group(1) if match else ""

    def is_satisfied(self, action: Action) -> bool:
        if action.kind in (ActionKind.REBOOT, ActionKind.RESTART_JOB, ActionKind.MIGRATE_JOB,
                           ActionKind.PREEMPT_NOTICE):
            return False
        if action.kind is ActionKind.PREEMPT:
            # a job that no longer runs (requeued, preempted by Slurm itself, done) holds nothing to give back
            return self.job_state(parse_entity(action.target)[1][0]) not in _RUNNING_STATES
        if action.kind is ActionKind.SET_QUOTA:
            qos, tres, units = self.quota(action)
            return f"{tres}={units}" in self.qos_limit(qos).split(",")
        state = self.node_state(parse_entity(action.target)[1][0]).upper()
        draining = "DRAIN" in state
        return not draining if action.kind is ActionKind.UNCORDON else draining

    def execute(self, action: Action) -> str:
        if action.kind is ActionKind.MIGRATE_JOB:
            return self.migrate(action)
        argv = self.command(action)
        self._run(argv)
        return " ".join(argv[1:4])

    # ------------------------------------------------------------------ migrate_job

    def _drain_command(self, node: str, action: Action) -> list[str]:
        return [self.scontrol, "update", f"nodename={node}", "state=drain", f"reason={self.reason(action)}"]

    def describe_migration(self, action: Action) -> str:
        job, named = parse_entity(action.target)[1][0], migration_nodes(action)
        # the job's own exclusions and its drained or down nodes are read from Slurm only when it runs
        excluded = ",".join([*named, "<its ExcNodeList and drained or down nodes>"])
        steps = [" ".join(self._drain_command(node, action)) for node in named]
        steps += [f"{self.scontrol} requeuehold {job}", f"{self.scontrol} update jobid={job} excnodelist={excluded}",
                  f"{self.scontrol} release {job}"]
        return (f"run, if {self.scontrol} show job {job} says Requeue=1 (a pending job is only updated): "
                + "; ".join(steps))

    def _hostnames(self, nodelist: str) -> list[str]:
        return self._run([self.scontrol, "show", "hostnames", nodelist]).split() if nodelist else []

    def migrate(self, action: Action) -> str:
        job = parse_entity(action.target)[1][0]
        fields = job_fields(self._run([self.scontrol, "show", "job", job, "-o"]))
        if fields.get("Requeue") != "1" or fields.get("BatchFlag") == "0":
            why = "not a batch job" if fields.get("BatchFlag") == "0" else f"Requeue={fields.get('Requeue', '?')}"
            raise ActuatorError(f"job {job} cannot be migrated: Slurm will not requeue it ({why} in scontrol show "
                                f"job {job}; submit it with sbatch --requeue)")
        named = migration_nodes(action)
        states = {node: self.node_state(node).upper() for node in dict.fromkeys(named + self._hostnames(
            fields.get("NodeList", "")))}
        bad = named + [n for n, state in states.items() if n not in named and any(s in state for s in _OUT_STATES)]
        if not bad:
            raise ActuatorError(f"job {job} runs on {fields.get('NodeList') or 'no node'} and none is drained or "
                                "down: name the bad node (--node node/NAME), or restart_job to requeue it in place")
        drained = [node for node in named if not any(s in states[node] for s in _OUT_STATES)]
        for node in drained:
            self._run(self._drain_command(node, action))
        state, held = fields.get("JobState", ""), fields.get("Reason") == _REQUEUE_HELD
        requeued = state != "PENDING"
        if requeued:
            self._run([self.scontrol, "requeuehold", job])
        excluded = ",".join(dict.fromkeys(self._hostnames(fields.get("ExcNodeList", "")) + bad))
        self._run([self.scontrol, "update", f"jobid={job}", f"excnodelist={excluded}"])
        if requeued or held:
            self._run([self.scontrol, "release", job])
        done = "requeued" if requeued else "pending, updated"
        return (f"job {job} {done} with excnodelist={excluded}"
                + (f", drained {','.join(drained)}" if drained else "") + ": it restarts on other nodes")
