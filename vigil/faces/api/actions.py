"""Approving and executing a stored action: the one place that decides them for the REST API and the MCP tools.

Both faces call ``approve`` and ``execute`` with the caller's identity and get the same answer, or the same
``ActionRefused`` (the REST API answers with its HTTP status, an MCP tool with its one line).

Executing asks the remediator of the server's back end (blast-radius guard, node lifecycle, idempotence, audit),
and the action records its verdict. A dry run asks the same remediator what it would do now - the back end's own
command line, or why the guard or the lifecycle would stop it - without calling the back end. The action records
that verdict as well: ``proposed`` (a dry run's status everywhere in Vigil) saying what would run, to be approved
again before it runs for real, or ``refused`` / ``skipped`` / ``failed`` saying why not. The audit log records the
dry run under an id of its own naming the action (``params.dry_run_of``), since it holds one record per action id.
"""

from __future__ import annotations

import time

from fastapi import status

from vigil.faces.api.auth import Identity, Role
from vigil.faces.api.context import ServeContext
from vigil.model import Action, ActionStatus, VigilInputError, new_id


class ActionRefused(VigilInputError):
    """An approval or execution that cannot go ahead; ``status_code`` is the REST API's answer."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


def approve(ctx: ServeContext, action_id: str, user: Identity) -> Action:
    """proposed -> approved, by an approver; with the two-person rule on (the default) not by whoever proposed a
    destructive action. Approving an approved action again changes nothing."""
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
        action.status = ActionStatus.APPROVED
        action.params = {**action.params, "approved_by": user.name, "approved_at": time.time()}
        ctx.store.update_action(action)
        return action


def execute(ctx: ServeContext, action_id: str, user: Identity, *, dry_run: bool) -> Action:
    """Run an approved action, or dry-run it (see the module's docstring), by an operator. A real run needs
    execute_actions on; either needs a back end."""
    with ctx.action_lock:
        action = _stored(ctx, action_id)
        _require(user, Role.OPERATOR, "executing")
        if action.status is not ActionStatus.APPROVED:
            raise ActionRefused(status.HTTP_409_CONFLICT,
                                f"action {action_id} is {action.status.value}; approve it before executing")
        if ctx.remediator is None:
            raise ActionRefused(status.HTTP_409_CONFLICT, "no remedy back end on this server (--actuator none, or "
                                "the setting remedy_backend none): nothing can run the action")
        if dry_run:
            trial = action.model_copy(deep=True, update={"id": new_id("act")})
            trial.params["dry_run_of"] = action.id
            decided = ctx.remediator.execute(trial, dry_run=True)
            decided.params.pop("dry_run_of")
        elif ctx.remediator.dry_run:
            raise ActionRefused(status.HTTP_409_CONFLICT,
                                "real execution is off (settings execute_actions=false); use dry_run=true")
        else:
            decided = ctx.remediator.execute(action)
        action.status, action.result, action.dry_run = decided.status, decided.result, decided.dry_run
        action.params = {**action.params, **decided.params, "executed_by": user.name, "executed_at": time.time()}
        ctx.store.update_action(action)
        return action


def _stored(ctx: ServeContext, action_id: str) -> Action:
    found = ctx.store.action(action_id)
    if found is None:
        raise ActionRefused(status.HTTP_404_NOT_FOUND, f"no action {action_id!r}")
    return found


def _require(user: Identity, role: Role, doing: str) -> None:
    if user.role < role:
        raise ActionRefused(status.HTTP_403_FORBIDDEN,
                            f"user {user.name!r} is {user.role.label}; {doing} needs {role.label}")
