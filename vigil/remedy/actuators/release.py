"""Releasing GPUs where no scheduler can take them back: a request to the job's owner, in the outbox."""

from __future__ import annotations

from vigil.model import Action, ActionKind
from vigil.remedy.actuators.base import OutboxActuator


class ReleaseRequestActuator(OutboxActuator):
    """The release step where no scheduler can take GPUs back: a request to the job's owner, in the outbox.

    Only idle-policy releases marked ``release_by: owner`` come here, so a scheduler's preemption is never
    turned into a request by mistake. Executed means the request was delivered, not that the GPUs are free:
    the next run of the policy still sees them idle and the incident stays open until someone closes it.
    """

    name = "release-request"
    kinds = frozenset({ActionKind.PREEMPT})
    target_kinds = frozenset({"job"})

    def accepts(self, action: Action) -> bool:
        return super().accepts(action) and action.params.get("release_by") == "owner"

    @staticmethod
    def _what(action: Action) -> str:
        gpus = [str(g) for g in action.params.get("idle_gpus", [])]
        nodes = [str(n) for n in action.params.get("nodes", [])]
        return f"{len(gpus)} idle GPUs ({', '.join(gpus[:16])}) on {', '.join(nodes) or 'its machines'}"

    def describe(self, action: Action) -> str:
        return (f"ask the owner of {action.target} to stop its work and free {self._what(action)}: no scheduler "
                f"releases them; append a release request to {self.path}")

    def record(self, action: Action) -> dict[str, object]:
        return {
            **super().record(action),
            "kind": "release_request",
            "idle_gpus": list(action.params.get("idle_gpus", [])),
            "nodes": list(action.params.get("nodes", [])),
        }

    def record_kind(self, action: Action) -> str:
        return f"release request for {self._what(action)}"
