"""Releasing GPUs where no scheduler can take them back: a request to the job's owner, in the outbox."""

from __future__ import annotations

import json
import time
from pathlib import Path

from vigil.model import Action, ActionKind
from vigil.remedy.actuators.base import Actuator


class ReleaseRequestActuator(Actuator):
    """The release step where no scheduler can take GPUs back: a request to the job's owner, in the outbox.

    Only idle-policy releases marked ``release_by: owner`` come here, so a scheduler's preemption is never
    turned into a request by mistake. Executed means the request was delivered, not that the GPUs are free:
    the next run of the policy still sees them idle and the incident stays open until someone closes it.
    """

    name = "release-request"
    kinds = frozenset({ActionKind.PREEMPT})
    target_kinds = frozenset({"job"})

    def __init__(self, outbox: str | Path) -> None:
        self.outbox = Path(outbox)

    def accepts(self, action: Action) -> bool:
        return super().accepts(action) and action.params.get("release_by") == "owner"

    @staticmethod
    def _what(action: Action) -> str:
        gpus = [str(g) for g in action.params.get("idle_gpus", [])]
        nodes = [str(n) for n in action.params.get("nodes", [])]
        return f"{len(gpus)} idle GPUs ({', '.join(gpus[:16])}) on {', '.join(nodes) or 'its machines'}"

    def describe(self, action: Action) -> str:
        return (f"ask the owner of {action.target} to stop its work and free {self._what(action)}: no scheduler "
                f"releases them; append a release request to {self.outbox}")

    def execute(self, action: Action) -> str:
        self.outbox.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "ts": time.time(), "kind": "release_request", "target": action.target, "reason": action.reason,
            "idle_gpus": list(action.params.get("idle_gpus", [])), "nodes": list(action.params.get("nodes", [])),
            "action_id": action.id,
        }
        with self.outbox.open("a") as outbox:
            outbox.write(json.dumps(record) + "\n")
        return f"release request for {self._what(action)} written to {self.outbox}"
