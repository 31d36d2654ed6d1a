"""The live engine on a store fed the way agents feed it: real dcgm-exporter pages and kernel lines through the
production decoders, then pushed samples, events and inventory -> incidents, diagnoses, actions, notifications."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.run.clock import Clock
from tests.run.pages import dcgm_page, xid_line
from vigil.config import Settings
from vigil.model import ActionKind, ActionStatus, Incident, IncidentStatus, Sample
from vigil.run.engine import Engine
from vigil.sources.collect.dcgm import DcgmExporterScraper
from vigil.sources.collect.kmsg import KernelLogSource
from vigil.store.sql import Store

NODES = ("n01", "n02")


class Recorder:
    """A notifier that keeps what it was sent."""

    name = "recorder"
    resend_s = float("inf")

    def __init__(self) -> None:
        self.sent: list[tuple[str, IncidentStatus]] = []

    def send(self, incidents: Sequence[Incident], now: float) -> None:
        self.sent += [(i.id, i.status) for i in incidents]


class Cluster:
    """Two nodes' agents, reduced to what they push: the scraper and kernel decoder run for real."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store, self.clock = store, clock
        self.scrapers = {n: DcgmExporterScraper("http://unused", node=n) for n in NODES}
        self.dbe = {n: {} for n in NODES}  # type: dict[str, dict[int, int]]

    def scrape(self) -> None:
        for node, scraper in self.scrapers.items():
            page = scraper.parse_page(dcgm_page(node, dbe=self.dbe[node]), self.clock.now)
            samples = [Sample(ts=self.clock.now, entity=p.entity, metric=p.metric, value=p.value) for p in page.points]
            self.store.add_samples(node, samples)

    def register(self) -> None:
        from vigil.model import Node

        for node, scraper in self.scrapers.items():
            self.store.register_node(Node(name=node, gpus=list(scraper.gpus.values())))

    def kernel_line(self, node: str, line: str) -> None:
        scraper = self.scrapers[node]
        kernel = KernelLogSource(lambda: [], node=node, gpu_index=lambda pci: scraper.pci_to_index.get(pci))
        event = kernel.decode(line, self.clock.now)
        assert event is not None
        self.store.add_events([event])


@pytest.fixture
def live(tmp_path: Path) -> tuple[Store, Clock, Cluster, Settings]:
    settings = Settings(home=tmp_path, resolve_after_s=120.0, engine_interval_s=1.0)
    store = Store(settings.database_url())
    clock = Clock()
    return store, clock, Cluster(store, clock), settings


def run_ticks(engine: Engine, clock: Clock, cluster: Cluster, n: int, step_s: float = 10.0) -> None:
    for _ in range(n):
        clock.now += step_s
        cluster.scrape()
        engine.tick()


def test_healthy_cluster_raises_nothing(live: tuple[Store, Clock, Cluster, Settings]) -> None:
    store, clock, cluster, settings = live
    cluster.scrape()
    cluster.register()
    engine = Engine(store, settings, notifiers=[], clock=clock)
    run_ticks(engine, clock, cluster, 12)
    assert engine.last_tick is not None and engine.last_tick.pushes == 2
    assert store.incidents() == [] and store.actions() == []


def test_faults_become_incidents_diagnoses_actions_alerts(live: tuple[Store, Clock, Cluster, Settings]) -> None:
    store, clock, cluster, settings = live
    recorder = Recorder()
    cluster.scrape()
    cluster.register()
    engine = Engine(store, settings, notifiers=[recorder], clock=clock)
    run_ticks(engine, clock, cluster, 2)
    cluster.kernel_line("n01", xid_line(gpu=1))
    cluster.dbe["n02"] = {2: 1}
    run_ticks(engine, clock, cluster, 1)

    incidents = {i.scope: i for i in store.incidents()}
    assert set(incidents) == {"gpu/n01/1", "gpu/n02/2"}
    assert incidents["gpu/n01/1"].fault_types == ["gpu_lost"]
    assert incidents["gpu/n02/2"].fault_types == ["gpu_dbe"]
    for scope, incident in incidents.items():
        diagnosis = store.diagnosis(incident.id)
        assert diagnosis is not None and diagnosis.root_cause is not None
        assert diagnosis.root_cause.entity == scope
        assert diagnosis.root_cause.fault_type == incident.fault_types[0]
        proposed = store.actions(incident_id=incident.id)
        assert {(a.kind, a.target) for a in proposed} >= {(ActionKind.CORDON, f"node/{scope.split('/')[1]}")}
        assert all(a.status is ActionStatus.PROPOSED and a.dry_run for a in proposed)
    assert sorted(recorder.sent) == sorted((i.id, IncidentStatus.OPEN) for i in incidents.values())

    # A restart (a new engine on the same store) takes the incidents up again: nothing new, nothing twice.
    actions_before = len(store.actions())
    restarted = Engine(store, settings, notifiers=[recorder], clock=clock)
    run_ticks(restarted, clock, cluster, 3)
    assert len(store.incidents()) == 2 and len(store.actions()) == actions_before
    assert len(recorder.sent) == 2

    # Quiet past resolve_after_s: both resolve, once each, and stay resolved.
    run_ticks(restarted, clock, cluster, 16)
    assert {i.status for i in store.incidents()} == {IncidentStatus.RESOLVED}
    assert sorted(s for s in recorder.sent if s[1] is IncidentStatus.RESOLVED) == sorted(
        (i.id, IncidentStatus.RESOLVED) for i in incidents.values())


def test_replayed_tick_after_a_crash_writes_the_same_rows(live: tuple[Store, Clock, Cluster, Settings]) -> None:
    """kill -9 after the outputs were written but before the cursor was: the replay finds the same ids."""
    store, clock, cluster, settings = live
    cluster.scrape()
    cluster.register()
    engine = Engine(store, settings, notifiers=[], clock=clock)
    run_ticks(engine, clock, cluster, 1)
    cursor = store.cursor("engine")
    cluster.kernel_line("n01", xid_line(gpu=0))
    clock.now += 10
    engine.tick()
    first = [(i.id, i.scope) for i in store.incidents()]
    actions = sorted(a.id for a in store.actions())
    assert len(first) == 1 and actions
    store.set_cursor("engine", cursor[0], cursor[1])  # the cursor write that never happened

    Engine(store, settings, notifiers=[], clock=clock).tick()
    assert [(i.id, i.scope) for i in store.incidents()] == first
    assert sorted(a.id for a in store.actions()) == actions


def test_acknowledged_incident_stays_acknowledged(live: tuple[Store, Clock, Cluster, Settings]) -> None:
    store, clock, cluster, settings = live
    cluster.scrape()
    cluster.register()
    engine = Engine(store, settings, notifiers=[], clock=clock)
    run_ticks(engine, clock, cluster, 1)
    cluster.kernel_line("n02", xid_line(gpu=3))
    run_ticks(engine, clock, cluster, 1)
    (incident,) = store.incidents()
    incident.status = IncidentStatus.ACKNOWLEDGED
    store.upsert_incident(incident)
    run_ticks(engine, clock, cluster, 8)
    assert store.incidents()[0].status is IncidentStatus.ACKNOWLEDGED


def test_gpu_missing_from_its_node_report(live: tuple[Store, Clock, Cluster, Settings]) -> None:
    """A GPU that drops out of its node's dcgm-exporter page while its siblings stay becomes an incident."""
    store, clock, cluster, settings = live
    cluster.scrape()
    cluster.register()
    engine = Engine(store, settings, notifiers=[], clock=clock)
    run_ticks(engine, clock, cluster, 2)
    clock.now += 10
    cluster.scrape()
    pushes = store.pushes_after(engine.push_cursor)
    n01 = next(p for p in pushes if p.node == "n01")
    store.prune_pushes(max(p.id for p in pushes))
    store.add_samples("n01", [Sample(ts=clock.now, entity=e, metric=m, value=v)
                              for m, e, v in n01.points if e != "gpu/n01/2"])
    store.add_samples("n02", [Sample(ts=clock.now, entity=e, metric=m, value=v)
                              for m, e, v in next(p for p in pushes if p.node == "n02").points])
    engine.tick()
    (incident,) = store.incidents()
    assert incident.scope == "gpu/n01/2" and incident.fault_types == ["gpu_metrics_missing"]


def test_topology_from_file_labels_and_inventory_is_versioned(tmp_path: Path) -> None:
    from vigil.model import Gpu, Node

    layout = tmp_path / "topology.yaml"
    layout.write_text("cluster: prod\nnodes:\n  - {name: n01, rack: r1, switch: leaf-01}\n"
                      "switches:\n  - {name: leaf-01}\n")
    settings = Settings(home=tmp_path, topology_file=str(layout))
    store = Store(settings.database_url())
    first = store.register_node(Node(name="n02", gpus=[Gpu(node="n02", index=0, uuid="GPU-a")],
                                     labels={"topology.vigil.io/rack": "r2", "topology.vigil.io/leaf": "leaf-02"}))
    Engine(store, settings, notifiers=[]).tick()
    second = store.register_node(Node(name="n01", gpus=[Gpu(node="n01", index=0, uuid="GPU-b")]))
    topology = store.topology()
    assert topology is not None and topology.cluster == "prod"
    placed = {n.name: (n.rack, n.switch, [g.uuid for g in n.gpus]) for n in topology.nodes}
    assert placed == {"n01": ("r1", "leaf-01", ["GPU-b"]), "n02": ("r2", "leaf-02", ["GPU-a"])}
    assert second > first and store.topology_version() == second
    old = store.topology_at(first)
    assert old is not None and [n.name for n in old.nodes] == ["n02"]
    # The same report again changes nothing and makes no new version.
    assert store.register_node(Node(name="n01", gpus=[Gpu(node="n01", index=0, uuid="GPU-b")])) == second
