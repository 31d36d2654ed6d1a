"""An action's verdict as a person reads it: a retry's verdict that replaced an earlier run's failure says so, with
the verdicts it replaced, in the CLI's tables and the dashboard as in the JSON (``params.earlier_verdicts``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vigil.model import Action, ActionStatus

# how a verdict reads after "on retry N": an executed action succeeded
_SAID = {ActionStatus.EXECUTED.value: "succeeded"}


def earlier_verdicts(action: Action) -> list[Mapping[str, Any]]:
    """The verdicts a retry's replaced on the stored action, oldest first (``params.earlier_verdicts``)."""
    earlier = action.params.get("earlier_verdicts")
    return [v for v in earlier if isinstance(v, Mapping)] if isinstance(earlier, list) else []


def retried_text(status: str, result: str, earlier: Sequence[Mapping[str, Any]], dropped: int = 0) -> str:
    """"succeeded on retry 2 (earlier: failed: ...; failed: ...): <result>" - the retry's number counts every earlier
    verdict, those dropped from the list (``params.earlier_verdicts_dropped``) too."""
    said = "; ".join(f"{v.get('status', '?')}: {v.get('result') or ''}".rstrip(": ") for v in earlier)
    if dropped:
        said = f"{dropped} older, {said}"
    head = f"{_SAID.get(status, status)} on retry {len(earlier) + dropped} (earlier: {said})"
    return f"{head}: {result}" if result else head


def verdict_text(action: Action) -> str:
    """The action's result, prefixed for a retry's verdict by what it replaced; the result (or the reason) alone
    otherwise."""
    earlier = earlier_verdicts(action)
    if not earlier:
        return action.result or action.reason
    dropped = action.params.get("earlier_verdicts_dropped")
    return retried_text(action.status.value, action.result, earlier, dropped if isinstance(dropped, int) else 0)


def audit_texts(actions: Sequence[Action]) -> list[str]:
    """``verdict_text`` for each audit record, in order: a record of a retry (``params.retry_of``) names the verdicts
    recorded before it for the same action among ``actions`` (the record under its id, and earlier retries)."""
    seen: dict[str, list[Mapping[str, Any]]] = {}
    texts = []
    for action in actions:
        retried = action.params.get("retry_of")
        of = str(retried) if retried else action.id
        before = seen.setdefault(of, [])
        if retried and before:
            texts.append(retried_text(action.status.value, action.result, before))
        else:
            texts.append(verdict_text(action))
        before.append({"status": action.status.value, "result": action.result})
    return texts
