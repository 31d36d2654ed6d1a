"""The idle-worker policy: notify a job whose GPUs sit idle, release it after the grace period, all through
the remediator (dry-run unless asked, audited)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from vigil.detect.waste import gpu_waste
from vigil.model import Action, ActionKind, ActionStatus, Job, Topology
from vigil.remedy.actuators.base import OutboxActuator
from vigil.remedy.actuators.release import ReleaseRequestActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.idle import IdleWorkerPolicy, idle_incident, idle_incident_id, idle_worker_actions
from vigil.remedy.remediator import Remediator
from vigil.store.metrics import MetricFrame, MetricStore

GPUS = ["gpu/n1/0", "gpu/n1/1", "gpu/n2/0", "gpu/n2/1"]
TOPOLOGY = Topology(jobs=[Job(id="busy", placement=GPUS[:2]), Job(id="idle", placement=GPUS[2:])])
GRACE = 600.0


def metrics_until(end: float, idle_from: float = 0.0) -> MetricStore:
    """Scrapes every 30 s up to ``end``; job "idle"'s GPUs do nothing from ``idle_from`` on."""
    store = MetricStore()
    names = ["DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED"]
    for ts in np.arange(0.0, end + 1, 30.0):
        working = 0.0 if ts >= idle_from else 0.8
        values = np.array([[0.9, 40000], [0.9, 40000], [working, 3], [working, 3]], dtype=np.float32)
        store.append(MetricFrame(ts=float(ts), family="gpu", entities=GPUS, metrics=names, values=values))
    return store


def step(
    now: float,
    audit: AuditLog,
    outbox: Path,
    execute: bool = True,
    idle_from: float = 0.0,
    bare: set[str] | None = None,
) -> list[Action]:
    report = gpu_waste(metrics_until(now, idle_from), TOPOLOGY, max(0.0, now - 2 * GRACE), now)
    # The release-request actuator is always there: it must take only releases marked for a bare machine's owner.
    actuators = [OutboxActuator(outbox), ReleaseRequestActuator(outbox)]
    remediator = Remediator(actuators, audit, dry_run=not execute, requested_by="idle-policy")
    wanted = idle_worker_actions(report, audit, IdleWorkerPolicy(GRACE), now=now, bare_jobs=bare or set())
    return [remediator.execute(a) for a in wanted]


def test_notice_then_release_after_the_grace_period(tmp_path: Path) -> None:
    audit, outbox = AuditLog(f"sqlite:///{tmp_path / 'audit.db'}"), tmp_path / "outbox.jsonl"
    # A dry run tells what it would do and starts no grace period.
    dry = step(900.0, audit, outbox, execute=False)
    assert [(a.kind, a.target, a.status) for a in dry] == [(ActionKind.ALERT, "job/idle", ActionStatus.PROPOSED)]
    assert not outbox.exists()
    first = step(1000.0, audit, outbox)
    assert [(a.kind, a.status) for a in first] == [(ActionKind.ALERT, ActionStatus.EXECUTED)]
    (notice,) = [json.loads(line) for line in outbox.read_text().splitlines()]
    assert notice["target"] == "job/idle" and "gpu/n2/0" in notice["reason"]
    assert step(1300.0, audit, outbox) == []  # within the grace period: nothing, and no second notice
    release = step(1000.0 + GRACE, audit, outbox)
    assert [(a.kind, a.target) for a in release] == [(ActionKind.PREEMPT, "job/idle")]
    # No back end here takes a preempt: refused, and the refusal is in the audit, as every step is.
    assert release[0].status is ActionStatus.REFUSED and "no actuator" in release[0].result
    kinds = [(a.kind, a.status) for a in audit.actions(target="job/idle")]
    assert kinds == [(ActionKind.ALERT, ActionStatus.PROPOSED), (ActionKind.ALERT, ActionStatus.EXECUTED),
                     (ActionKind.PREEMPT, ActionStatus.REFUSED)]
    assert not audit.actions(target="job/busy")


def test_a_bare_machine_gets_a_release_request_to_its_owner_once(tmp_path: Path) -> None:
    # No scheduler runs job "idle" (an interactive machine): notice, then a release request, never a preemption
    # that nothing could carry out.
    audit, outbox = AuditLog(f"sqlite:///{tmp_path / 'audit.db'}"), tmp_path / "outbox.jsonl"
    (notice,) = step(1000.0, audit, outbox, bare={"idle"})
    assert (notice.kind, notice.status) == (ActionKind.ALERT, ActionStatus.EXECUTED)
    incident = idle_incident(notice)
    assert incident.scope == "job/idle" and set(incident.entities) == {"job/idle", "gpu/n2/0", "gpu/n2/1"}
    assert len(outbox.read_text().splitlines()) == 1

    (dry,) = step(1000.0 + GRACE, audit, outbox, execute=False, bare={"idle"})
    assert (dry.kind, dry.status, dry.params["release_by"]) == (ActionKind.PREEMPT, ActionStatus.PROPOSED, "owner")
    assert dry.result.startswith("dry-run: would ask the owner of job/idle")
    assert "gpu/n2/0, gpu/n2/1" in dry.result and "node/n2" in dry.result
    assert len(outbox.read_text().splitlines()) == 1  # a dry run sends nothing

    (release,) = step(1030.0 + GRACE, audit, outbox, bare={"idle"})
    assert (release.kind, release.status) == (ActionKind.PREEMPT, ActionStatus.EXECUTED)
    request = json.loads(outbox.read_text().splitlines()[-1])
    assert request["kind"] == "release_request" and request["target"] == "job/idle"
    assert request["idle_gpus"] == ["gpu/n2/0", "gpu/n2/1"] and request["nodes"] == ["node/n2"]
    # Still idle at the next run: the same release (same notice, same idempotency key) is not sent twice.
    (again,) = step(1060.0 + GRACE, audit, outbox, bare={"idle"})
    assert again.status is ActionStatus.SKIPPED and "already executed" in again.result
    assert len(outbox.read_text().splitlines()) == 2

    assert idle_incident_id(release) == incident.id
    grown = idle_incident(release, incident)
    assert [e.attrs["action_id"] for e in grown.evidence] == [notice.id, release.id]
    assert idle_incident(release, grown).evidence == grown.evidence  # the same step twice adds nothing
    assert not audit.actions(target="job/busy")


def test_a_job_that_worked_after_its_notice_is_notified_again_not_released(tmp_path: Path) -> None:
    audit, outbox = AuditLog(f"sqlite:///{tmp_path / 'audit.db'}"), tmp_path / "outbox.jsonl"
    step(1000.0, audit, outbox)
    # It worked until 1500 s: past the grace period it is not released, since it did not idle throughout.
    assert step(1000.0 + 2 * GRACE, audit, outbox, idle_from=1500.0) == []
    # Idle again for a whole window: the old notice does not count, a new one is sent.
    again = step(1500.0 + 2 * GRACE, audit, outbox, idle_from=1500.0)
    assert [(a.kind, a.status) for a in again] == [(ActionKind.ALERT, ActionStatus.EXECUTED)]


def test_the_cli_runs_the_policy_on_the_stored_metrics(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from vigil.config import settings
    from vigil.faces.cli.main import app
    from vigil.store.sql import Store

    home = tmp_path / "home"
    home.mkdir()
    stored = MetricStore(home / "metrics")
    for frame_ts in np.arange(0.0, 3601.0, 30.0):
        values = np.array([[0.9, 40000], [0.9, 40000], [0.0, 3], [0.0, 3]], dtype=np.float32)
        stored.append(MetricFrame(ts=float(frame_ts), family="gpu", entities=GPUS,
                                  metrics=["DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED"], values=values))
    stored.flush()
    store = Store(f"sqlite:///{home / 'vigil.db'}")
    store.save_topology(TOPOLOGY)
    store.close()
    settings.cache_clear()
    try:
        env = {"VIGIL_HOME": str(home)}
        dry = CliRunner().invoke(app, ["remedy", "idle-workers", "--grace", "600", "--json"], env=env)
        assert dry.exit_code == 0, dry.output
        (action,) = json.loads(dry.stdout)
        assert action["kind"] == "alert" and action["target"] == "job/idle" and action["dry_run"]
        assert action["result"].startswith("dry-run: would append alert")
        bad = CliRunner().invoke(app, ["remedy", "idle-workers", "--backend", "pbs"], env=env)
        assert bad.exit_code != 0 and "backend" in str(bad.exception)
    finally:
        settings.cache_clear()


def test_the_cli_notifies_a_bare_machine_opens_an_incident_and_requests_the_release(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from vigil.config import settings
    from vigil.faces.cli.main import app
    from vigil.store.sql import Store

    home = tmp_path / "home"
    home.mkdir()
    names = ["DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED"]

    def scrape(first: float, last: float) -> None:
        stored = MetricStore(home / "metrics")
        for frame_ts in np.arange(first, last + 1.0, 30.0):
            values = np.array([[0.9, 40000], [0.9, 40000], [0.0, 3], [0.0, 3]], dtype=np.float32)
            stored.append(MetricFrame(ts=float(frame_ts), family="gpu", entities=GPUS, metrics=names, values=values))
        stored.flush()

    scrape(0.0, 3600.0)
    store = Store(f"sqlite:///{home / 'vigil.db'}")
    store.save_topology(TOPOLOGY)  # jobs registered from a file: no scheduler (source "") runs them
    store.close()
    settings.cache_clear()
    try:
        env = {"VIGIL_HOME": str(home)}
        args = ["remedy", "idle-workers", "--grace", "600", "--execute", "--json"]
        first = CliRunner().invoke(app, args, env=env)
        assert first.exit_code == 0, first.output
        (notice,) = json.loads(first.stdout)
        assert (notice["kind"], notice["status"], notice["target"]) == ("alert", "executed", "job/idle")
        scrape(3630.0, 4230.0)  # idle for the whole grace period since the notice
        second = CliRunner().invoke(app, args, env=env)
        assert second.exit_code == 0, second.output
        (release,) = json.loads(second.stdout)
        assert (release["kind"], release["status"]) == ("preempt", "executed")
        assert release["params"]["release_by"] == "owner" and release["params"]["actuator"] == "release-request"
        lines = [json.loads(line) for line in (home / "outbox.jsonl").read_text().splitlines()]
        assert [line["kind"] for line in lines] == ["alert", "release_request"]
        store = Store(f"sqlite:///{home / 'vigil.db'}")
        try:
            incident = store.incident(f"inc-idle-{notice['id']}")
        finally:
            store.close()
        assert incident is not None and incident.scope == "job/idle" and incident.fault_types == ["gpu_idle"]
        assert [e.attrs["action_id"] for e in incident.evidence] == [notice["id"], release["id"]]
    finally:
        settings.cache_clear()
