"""An API server that cannot be reached (refused connection): the official client raises urllib3's MaxRetryError,
which is no OSError. Every Kubernetes action then fails as one line and closes its journal row, instead of the
exception leaving the run journalled as started (resumed at the next start as if a crash had cut it) and the
remediator's caller with a traceback; `remedy act set_quota`'s look at the ClusterQueue says nothing."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from vigil.model import Action, ActionKind, ActionStatus
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator

kubernetes = pytest.importorskip("kubernetes")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def unreachable_api() -> object:
    config = kubernetes.client.Configuration()
    config.host = f"http://127.0.0.1:{_closed_port()}"
    config.retries = 0
    return kubernetes.client.ApiClient(config)


@pytest.mark.parametrize("actuator_module", ["kubernetes", "kueue"])
def test_an_unreachable_api_server_fails_the_action(tmp_path: Path, unreachable_api: object,
                                                     actuator_module: str) -> None:
    from vigil.remedy.actuators.kubernetes import KubernetesActuator
    from vigil.remedy.actuators.kueue import KueueActuator

    actuator = (KubernetesActuator if actuator_module == "kubernetes" else KueueActuator)(unreachable_api)
    audit = AuditLog(f"sqlite:///{tmp_path / 'vigil.db'}")
    remediator = Remediator([actuator], audit, dry_run=False)
    quota = Action(ts=0.0, kind=ActionKind.SET_QUOTA, target="cluster/c", reason="tide", status=ActionStatus.APPROVED,
                   params={"queue": "vigil-spot-training", "units": 4})
    notice = Action(ts=0.0, kind=ActionKind.PREEMPT_NOTICE, target="job/team-a:llm", reason="tide",
                    status=ActionStatus.APPROVED)
    for action in (quota, notice):
        done = remediator.execute(action)
        assert done.status is ActionStatus.FAILED, done
        assert "Max retries exceeded" in done.result or "refused" in done.result.lower(), done.result
    assert audit.unfinished_runs() == []  # nothing left for a restart to resume
    assert actuator.quota_problem(quota) is None  # the API cannot tell: the action fails on its own
