"""A failed job's next step per its failover policy (vigil/remedy/jobspec.py): restart it while retries are
left, then only tell people. The policy travels with the job: a `vigil launch` job spec, or for a Slurm batch
job its ``--comment`` holding the spec's ``failoverPolicy`` (``--comment='failoverPolicy: {maxRetries: 2}'``).
"""

from __future__ import annotations

import yaml
from pydantic import ValidationError

from vigil.model import Action, ActionKind, VigilInputError, describe_validation_error, job_id
from vigil.remedy.jobspec import FailoverPolicy


def policy_from_comment(comment: str) -> FailoverPolicy:
    """The failover policy a job's comment carries; the default policy when it carries none."""
    try:
        data = yaml.safe_load(comment) if comment.strip() else None
    except yaml.YAMLError:
        data = None
    if not isinstance(data, dict) or "failoverPolicy" not in data:
        return FailoverPolicy()
    try:
        return FailoverPolicy.model_validate(data["failoverPolicy"])
    except ValidationError as err:
        raise VigilInputError(f"job comment failoverPolicy: {describe_validation_error(err)}") from None


def failover_action(job: str, restarts: int, policy: FailoverPolicy, ts: float, reason: str = "") -> Action:
    """Restart (or migrate) while ``restarts < maxRetries``; past that, an alert that retries are spent."""
    if restarts < policy.max_retries:
        kind = policy.action_kind
        why = f"failover {restarts + 1} of {policy.max_retries}: {reason}".strip(": ")
    else:
        kind = ActionKind.ALERT
        why = f"failover retries spent ({restarts} of {policy.max_retries}): {reason}".strip(": ")
    return Action(ts=ts, kind=kind, target=job_id(job), reason=why, requested_by="vigil-failover",
                  params={"restarts": restarts, "max_retries": policy.max_retries})
