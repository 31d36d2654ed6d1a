"""Slurm actuator: ``scontrol`` on the PATH (or a given path).

- cordon / drain: ``scontrol update nodename=N state=drain reason="vigil: ..."``. Slurm's DRAIN lets
  running jobs finish and schedules nothing new, which is Kubernetes' cordon + allow-completion drain.
- uncordon: ``scontrol update nodename=N state=resume``.
- reboot: ``scontrol reboot ASAP nextstate=resume reason="..." N`` (reboots once the node is idle).
- restart_job: ``scontrol requeue J`` (a failed or running batch job goes back to the queue; Slurm counts
  it in the job's Restarts).

Idempotence reads ``scontrol show node N -o``: a node whose State already carries DRAIN is not
drained again. The tests put a fake ``scontrol`` on PATH that records its calls.
"""

from __future__ import annotations

import re

from vigil.model import Action, ActionKind, parse_entity
from vigil.remedy.actuators.base import Actuator, ActuatorError, run_command

_STATE = re.compile(r"\bState=(\S+)")
_SAFE_REASON = re.compile(r"[^A-Za-z0-9 _.,:/=()\-]")


class SlurmActuator(Actuator):
    name = "slurm"
    kinds = frozenset({ActionKind.CORDON, ActionKind.DRAIN, ActionKind.UNCORDON, ActionKind.REBOOT,
                       ActionKind.RESTART_JOB})
    target_kinds = frozenset({"node", "job"})

    def accepts(self, action: Action) -> bool:
        kind = parse_entity(action.target)[0]
        if action.kind is ActionKind.RESTART_JOB:
            return kind == "job"
        return action.kind in self.kinds and kind == "node"

    def __init__(self, scontrol: str = "scontrol", timeout_s: float = 30.0) -> None:
        self.scontrol = scontrol
        self.timeout_s = timeout_s

    @staticmethod
    def reason(action: Action) -> str:
        # Slurm stores the reason verbatim; keep it short and free of quotes / shell metacharacters.
        return ("vigil: " + _SAFE_REASON.sub("_", action.reason))[:200]

    def command(self, action: Action) -> list[str]:
        node = parse_entity(action.target)[1][0]
        if action.kind is ActionKind.RESTART_JOB:
            return [self.scontrol, "requeue", node]
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

    def describe(self, action: Action) -> str:
        return "run " + " ".join(self.command(action))

    def _run(self, argv: list[str]) -> str:
        return run_command(argv, self.timeout_s, " ".join(argv[:3])).stdout

    def node_state(self, node: str) -> str:
        match = _STATE.search(self._run([self.scontrol, "show", "node", node, "-o"]))
        return match.group(1) if match else ""

    def is_satisfied(self, action: Action) -> bool:
        if action.kind in (ActionKind.REBOOT, ActionKind.RESTART_JOB):
            return False
        state = self.node_state(parse_entity(action.target)[1][0]).upper()
        draining = "DRAIN" in state
        return not draining if action.kind is ActionKind.UNCORDON else draining

    def execute(self, action: Action) -> str:
        argv = self.command(action)
        self._run(argv)
        return " ".join(argv[1:4])
