from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from tests.store.keyed_events import (
    assert_a_batch_counts_the_events_it_wrote,
    assert_a_racing_write_of_the_same_keys_is_counted_once,
)
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


def test_registering_agents_stores_each_node_once_and_keeps_every_version(tmp_path: Path) -> None:
    """Each registration stores its node, not the whole cluster again: what 300 agents write grows with the
    nodes, not their square; every version still reads back as the cluster was then, across the points where
    the topology is written whole again."""
    from vigil.model import Gpu, Node
    from vigil.store import sql

    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    store.save_topology(build_topology(nodes=2, gpus=1).model_copy(update={"cluster": "prod"}))

    def node(k: int, uuid: str = "a") -> Node:
        return Node(name=f"m{k:03d}", gpus=[Gpu(node=f"m{k:03d}", index=i, uuid=f"GPU-{k}-{i}-{uuid}")
                                            for i in range(8)], labels={"topology.vigil.io/rack": f"r{k % 4}"})

    versions = [store.register_node(node(k)) for k in range(300)]
    assert versions == sorted(set(versions)) and store.topology_version() == versions[-1]
    rows = sqlite3.connect(tmp_path / "v.db").execute(
        "select node is null, length(body) from topology_versions").fetchall()
    whole = [size for is_whole, size in rows if is_whole]
    one_node = max(size for is_whole, size in rows if not is_whole)
    assert 2 <= len(whole) <= 1 + math.ceil(math.log2(300 / sql.WHOLE_AFTER)) + 1  # written whole ever more rarely
    assert sum(size for _, size in rows) < 6 * 300 * one_node  # linear in the nodes (it was 300 * 301 / 2 nodes)

    topology = store.topology()
    assert topology is not None and topology.cluster == "prod" and len(topology.nodes) == 302
    assert topology.node("m007").rack == "r3" and topology.node("m007").gpus[2].uuid == "GPU-7-2-a"
    for k in (0, 63, 64, 65, 130, 299):  # before, at and after the whole versions
        then = store.topology_at(versions[k])
        assert then is not None and then.cluster == "prod"
        assert sorted(n.name for n in then.nodes if n.name.startswith("m")) == [f"m{i:03d}" for i in range(k + 1)]
    # A node that reports new GPUs replaces its old ones; the same report again is no new version.
    changed = store.register_node(node(7, uuid="b"))
    assert changed > versions[-1] and store.register_node(node(7, uuid="b")) == changed
    current = store.topology()
    assert current is not None and current.node("m007").gpus[0].uuid == "GPU-7-0-b"
    before = store.topology_at(versions[-1])
    assert before is not None and before.node("m007").gpus[0].uuid == "GPU-7-0-a"
    assert Store(f"sqlite:///{tmp_path / 'v.db'}").topology() == current  # a fresh store reads the same


def test_a_batch_counts_the_events_it_wrote_on_sqlite(tmp_path: Path) -> None:
    assert_a_batch_counts_the_events_it_wrote(f"sqlite:///{tmp_path / 'v.db'}")


def test_a_racing_write_of_the_same_keys_is_counted_once_on_sqlite(tmp_path: Path) -> None:
    assert_a_racing_write_of_the_same_keys_is_counted_once(f"sqlite:///{tmp_path / 'v.db'}")
