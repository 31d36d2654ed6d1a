from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from vigil.model import Action, ActionKind, Anomaly, Event, FaultLevel, Incident, VigilInputError
from vigil.sources.sim.cluster import build_topology
from vigil.store.sql import Store


def make_incident(**kw: object) -> Incident:
    base = dict(title="gpu dbe on gpu/n000/1", scope="gpu/n000/1", entities=["gpu/n000/1"], start=1.0, end=2.0,
                level=FaultLevel.ISOLATE, fault_types=["gpu_dbe"])
    base.update(kw)
    return Incident(**base)  # type: ignore[arg-type]


def test_round_trip_of_every_record(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    store.add_events([Event(ts=1, entity="gpu/n000/1", kind="xid", attrs={"xid": 48})])
    anomaly = Anomaly(entity="gpu/n000/1", start=1, end=2, detector="rules", fault_type="gpu_dbe",
                      level=FaultLevel.ISOLATE)
    store.add_anomalies([anomaly])
    incident = make_incident(anomalies=[anomaly.id])
    store.upsert_incident(incident)
    action = Action(ts=3, kind=ActionKind.CORDON, target="node/n000", incident_id=incident.id)
    store.add_action(action)
    topo = build_topology(nodes=2, gpus=2)
    store.save_topology(topo)
    assert store.events(entity="gpu/n000/1")[0].attrs == {"xid": 48}
    assert store.anomalies() == [anomaly]
    assert store.incident(incident.id) == incident
    assert store.actions(incident_id=incident.id) == [action]
    assert store.topology() == topo
    health = store.node_health()
    assert health["gpu/n000/1"] is FaultLevel.ISOLATE and health["node/n000"] is FaultLevel.ISOLATE
    assert health["gpu/n001/0"] is FaultLevel.HEALTHY


def test_upsert_updates_in_place(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    incident = make_incident()
    store.upsert_incident(incident)
    incident.end = 99.0
    store.upsert_incident(incident)
    assert store.count_incidents() == 1 and store.incident(incident.id).end == 99.0  # type: ignore[union-attr]


def test_a_bad_record_rejects_its_batch_and_keeps_what_was_stored(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    store.add_events([Event(ts=1, entity="node/n000", kind="k8s")])
    with pytest.raises(VigilInputError, match="'entity'"):
        store.add_events([Event(ts=2, entity="node/n000", kind="k8s"),
                          {"ts": 3, "entity": "node n000; DROP TABLE events", "kind": "k8s"}])  # type: ignore[list-item]
    assert len(store.events()) == 1


def test_store_survives_reopen_and_migrates_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'v.db'}"
    Store(url).upsert_incident(make_incident())
    reopened = Store(url)
    assert len(reopened.incidents()) == 1
    tables = {r[0] for r in sqlite3.connect(tmp_path / "v.db").execute("select name from sqlite_master")}
    assert {"events", "incidents", "alembic_version"} <= tables


def test_bad_url_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(VigilInputError, match="database URL|cannot open"):
        Store("notadb://x")
