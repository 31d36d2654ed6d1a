"""Approving and executing a stored action: the one place that decides them for the REST API and the MCP tools.

Both faces call ``approve`` and ``execute`` with the caller's identity and get the same answer, or the same
``ActionRefused`` (the REST API answers with its HTTP status, an MCP tool with its one line).

Executing asks the remediator of the server's back end (blast-radius guard, node lifecycle, idempotence, audit),
and the action records its verdict - unless the verdict is a late answer (this server stalled past its claim on the
run and another process resumed it), which is stored as an action of its own naming the action
(``params.late_completion_of``) and leaves the action as it was. A dry run asks the same remediator what it would
do now - the back end's own command line, or why the guard or the lifecycle would stop it - without calling the
back end, and writes nothing to the action: a proposed action stays proposed, an approved one approved (a refusal
the guard would give is an answer, not a verdict), and an approval another server writes while the dry run is
deciding stays, where writing back the action as it was read would undo it. The answer is the action with
``dry_run`` true, ``result`` saying what would happen and ``params.dry_run_status`` the status a real run would get
now. The audit log records the dry run under an id of its own naming the action (``params.dry_run_of``; the
answer's ``params.dry_run_record``), since it holds one record per action id; the dashboard shows an action's last
dry run from there.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from fastapi import status

from vigil.faces.api.auth import Identity, Role
from vigil.faces.api.context import ServeContext
from vigil.model import Action, ActionStatus, VigilInputError, new_id

if TYPE_CHECKING:
    from vigil.remedy.remediator import Remediator


class ActionRefused(VigilInputError):
    """An approval or execution that cannot go ahead; ``status_code`` is the REST API's answer."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


def approve(ctx: ServeContext, action_id: str, user: Identity) -> Action:
    """proposed -> approved, by an approver; with the two-person rule on (the default) not by whoever proposed a
    destructive action. Approving an approved action again changes nothing and answers the approval stored, the
    second of two approvals at once (two servers) too: it neither replaces ``approved_by`` nor fails."""
    with ctx.action_lock:
        action = _stored(ctx, action_id)
        _require(user, Role.APPROVER, "approving")
        if action.status is ActionStatus.APPROVED:
            return action
        if action.status is not ActionStatus.PROPOSED:
            raise ActionRefused(status.HTTP_409_CONFLICT, f"action {action_id} is {action.status.value}; only a "
                                "proposed action can be approved")
        if action.kind.destructive and not ctx.auth.may_approve(user, action.requested_by):
            raise ActionRefused(status.HTTP_403_FORBIDDEN, f"two-person rule: {user.name} proposed this "
                                f"{action.kind.value}; another approver must approve it")
        # a compare-and-set from proposed: of two approvals at once (two servers), the second finds the first's
        won, stored = ctx.store.settle_action(action_id, {ActionStatus.PROPOSED}, ActionStatus.APPROVED,
                                              params={"approved_by": user.name, "approved_at": time.time()})
        if stored is None:
            raise ActionRefused(status.HTTP_404_NOT_FOUND, f"no action {action_id!r}")
        if not won and stored.status is not ActionStatus.APPROVED:
            raise ActionRefused(status.HTTP_409_CONFLICT, f"action {action_id} is {stored.status.value}; only a "
                                "proposed action can be approved")
        return stored


def execute(ctx: ServeContext, action_id: str, user: Identity, *, dry_run: bool) -> Action:
    """Run an approved action, or dry-run a proposed or approved one (see the module's docstring), by an
    operator. A real run needs execute_actions on; either needs a back end."""
    with ctx.action_lock:
        action = _stored(ctx, action_id)
        _require(user, Role.OPERATOR, "executing")
        if action.status not in (ActionStatus.APPROVED, *((ActionStatus.PROPOSED,) if dry_run else ())):
            what = "a dry run needs a proposed or approved action" if dry_run else "approve it before executing"
            raise ActionRefused(status.HTTP_409_CONFLICT, f"action {action_id} is {action.status.value}; {what}")
        if ctx.remediator is None:
            raise ActionRefused(status.HTTP_409_CONFLICT, "no remedy back end on this server (--actuator none, or "
                                "the setting remedy_backend none): nothing can run the action")
        if dry_run:
            return _dry_run(ctx.remediator, action, user)
        if ctx.remediator.dry_run:
            raise ActionRefused(status.HTTP_409_CONFLICT,
                                "real execution is off (settings execute_actions=false); use dry_run=true")
        action.params.update(executed_by=user.name, executed_at=time.time())
        decided = ctx.remediator.execute(action)
        if decided.params.get("repeat_of") == action.id:  # another server's run of it: the action is that run's
            raise ActionRefused(status.HTTP_409_CONFLICT, f"action {action_id}: {decided.result}")
        if "late_completion_of" in decided.params:
            # This server's claim on the run lapsed while the back end worked (a stall) and another process resumed
            # it: the action's state is that run's, and this late answer is recorded beside it, under its own id.
            ctx.store.add_action(decided)
            return decided
        # The run's close has settled the action already; a verdict reached before the back end (the guard refused,
        # the lifecycle has it done) is written here - both only from approved, so neither takes another's place.
        _, stored = ctx.store.settle_action(action_id, {ActionStatus.APPROVED}, decided.status, result=decided.result,
                                            params=decided.params, dry_run=decided.dry_run)
        if stored is None:
            raise ActionRefused(status.HTTP_404_NOT_FOUND, f"no action {action_id!r}")
        return stored


def _dry_run(remediator: Remediator, action: Action, user: Identity) -> Action:
    """What a real run of ``action`` would do now, audited as a dry run of it; ``action``'s status is kept."""
    trial = action.model_copy(deep=True, update={"id": new_id("act")})
    trial.params["dry_run_of"] = action.id
    decided = remediator.execute(trial, dry_run=True)
    answer = action.model_copy(deep=True, update={"dry_run": True, "result": decided.result})
    answer.params.update(dry_run_status=decided.status.value, dry_run_record=decided.id, dry_run_by=user.name,
                         dry_run_at=time.time())
    return answer


def _stored(ctx: ServeContext, action_id: str) -> Action:
    found = ctx.store.action(action_id)
    if found is None:
        raise ActionRefused(status.HTTP_404_NOT_FOUND, f"no action {action_id!r}")
    return found


def _require(user: Identity, role: Role, doing: str) -> None:
    if user.role < role:
        raise ActionRefused(status.HTTP_403_FORBIDDEN,
                            f"user {user.name!r} is {user.role.label}; {doing} needs {role.label}")
