"""Delete checkpoint directories that a clean-up proposal named (``vigil checkpoint clean``).

The Remediator has already applied the whitelist, dry-run and the audit record; this actuator still refuses
anything outside the checkpoint roots it was given, anything that is not a ``step-<N>`` directory, and - right
before deleting - any directory the proposal's own rule no longer removes (a checkpoint that became one of the
newest ``keep_last`` again, a partial save that was touched since), so a stale or edited action deletes nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from vigil.checkpoint.cleanup import why_removable
from vigil.model import Action, ActionKind
from vigil.remedy.actuators.base import Actuator, ActuatorError


class CheckpointCleanupActuator(Actuator):
    name = "checkpoint-cleanup"
    kinds = frozenset({ActionKind.DELETE_CHECKPOINT})
    target_kinds = frozenset({"job"})

    def __init__(self, roots: list[Path]) -> None:
        self.roots = [root.resolve() for root in roots]

    def _path(self, action: Action) -> Path:
        raw = action.params.get("path")
        if not isinstance(raw, str) or not raw:
            raise ActuatorError("delete_checkpoint needs params.path")
        path = Path(raw)
        if path.is_symlink() or not any(path.resolve().is_relative_to(root) for root in self.roots):
            raise ActuatorError(f"{raw} is not inside a checkpoint directory this command was given")
        return path

    def accepts(self, action: Action) -> bool:
        try:
            self._path(action)
        except ActuatorError:
            return False
        return super().accepts(action)

    def describe(self, action: Action) -> str:
        return f"rm -r {self._path(action)} ({action.params.get('why')}, {action.params.get('bytes', 0):,} bytes)"

    def is_satisfied(self, action: Action) -> bool:
        return not self._path(action).exists()

    def execute(self, action: Action) -> str:
        path = self._path(action)
        keep_last = int(action.params.get("keep_last", 0))
        partial_age_s = float(action.params.get("partial_age_s", 0.0))
        if keep_last < 1:
            raise ActuatorError("delete_checkpoint needs params.keep_last >= 1")
        now_reason = why_removable(path, keep_last, partial_age_s)
        if now_reason is None or now_reason != action.params.get("why"):
            raise ActuatorError(f"{path} is no longer removable ({now_reason or 'kept by its rule'}); nothing deleted")
        shutil.rmtree(path)
        return f"deleted {path} ({now_reason})"
