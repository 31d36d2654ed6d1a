"""Clean-up proposals for a checkpoint volume: what can go, why, and how much it frees.

Two kinds, both inside one job's checkpoint directory (``step-<N>/``, the manager's layout):

- **beyond retention**: complete checkpoints older than the newest ``keep_last`` complete ones (a job whose
  retention did not run: it crashed between save and prune, or it wrote with a larger ``keep_last``);
- **orphaned partial save**: a step directory without DCP's ``.metadata`` that is older than the newest
  complete checkpoint and untouched for ``partial_age_s`` (a save cut off by a crash; never the save in
  flight, which is newer than every complete one).

A proposal is only a proposal: each becomes a ``delete_checkpoint`` Action on ``job/<name>`` that runs
through the Remediator (whitelist, dry-run by default, idempotency key, audit record), and the actuator
(``vigil.remedy.actuators.checkpoint``) checks the directory again right before it deletes anything.
Sizes are GNU du's (``vigil.sources.fscount``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vigil.checkpoint.manager import _METADATA, _STEP_DIR
from vigil.model import Action, ActionKind, VigilInputError, job_id
from vigil.sources.fscount import scan

Reason = Literal["beyond retention", "orphaned partial save"]


@dataclass(frozen=True)
class CleanupProposal:
    path: str
    step: int
    reason: Reason
    bytes: int
    files: int

    def action(self, job: str, keep_last: int, partial_age_s: float) -> Action:
        """The proposal as the whitelisted action the Remediator audits and executes."""
        return Action(
            ts=time.time(),
            kind=ActionKind.DELETE_CHECKPOINT,
            target=job_id(job),
            reason=f"{self.reason}: step {self.step} ({self.bytes:,} bytes)",
            params={
                "path": self.path,
                "step": self.step,
                "why": self.reason,
                "bytes": self.bytes,
                "keep_last": keep_last,
                "partial_age_s": partial_age_s,
            },
        )


def step_dirs(directory: Path) -> list[tuple[int, Path, bool]]:
    """(step, path, complete) of every step directory, oldest first."""
    found = []
    for child in directory.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir() and not child.is_symlink():
            found.append((int(match.group(1)), child, (child / _METADATA).is_file()))
    return sorted(found)


def why_removable(path: Path, keep_last: int, partial_age_s: float, now: float | None = None) -> Reason | None:
    """Why the step directory ``path`` may go now, or None: the one rule both the proposal and the actuator
    (again, right before deleting) apply."""
    match = _STEP_DIR.match(path.name)
    if match is None or not path.is_dir() or path.is_symlink():
        return None
    step = int(match.group(1))
    dirs = step_dirs(path.parent)
    complete = [s for s, _, done in dirs if done]
    if (path / _METADATA).is_file():
        return "beyond retention" if step in complete[: max(0, len(complete) - keep_last)] else None
    newest_complete = complete[-1] if complete else None
    if newest_complete is None or step >= newest_complete:
        return None  # possibly the save in flight
    now = time.time() if now is None else now
    newest_touch = max([os.lstat(path).st_mtime, *(os.lstat(path / n).st_mtime for n in os.listdir(path))])
    return "orphaned partial save" if now - newest_touch >= partial_age_s else None


def propose_cleanup(directory: Path, keep_last: int, partial_age_s: float = 3600.0) -> list[CleanupProposal]:
    """What may be removed from one job's checkpoint directory, oldest first, with du's sizes."""
    if keep_last < 1:
        raise VigilInputError(f"keep_last must be at least 1, not {keep_last}")
    if not partial_age_s >= 0:
        raise VigilInputError(f"the partial-save age must be 0 or more seconds, not {partial_age_s}")
    if not directory.is_dir():
        raise VigilInputError(f"checkpoint directory {directory} "
                              f"{'is not a directory' if directory.exists() else 'does not exist'}")
    now = time.time()
    proposals = []
    for step, path, _ in step_dirs(directory):
        reason = why_removable(path, keep_last, partial_age_s, now)
        if reason is not None:
            usage = scan(path).totals[os.path.abspath(path)]
            proposals.append(CleanupProposal(str(path.resolve()), step, reason, usage.bytes, usage.files))
    return proposals
