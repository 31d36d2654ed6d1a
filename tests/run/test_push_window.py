"""The engine's window of metric pushes, on SQLite and the suite's PostgreSQL: in steady state the pushes it has read
are kept for live_push_max_age_s only (at most a batch dropped a tick); a restart replays the newest of them under
the live path's rules; a node's pushes are ordered by its own clock's stamps, so a backlog sent after the newest
push - from a node whose clock is ahead - changes nothing the newest set; stale and late pushes are counted on the
server's /metrics."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.run.clock import Clock
from tests.run.pages import COOL, HOT, dcgm_page
from tests.serve.conftest import postgres_url as postgres_url
from tests.store.conftest import db_url as db_url
from vigil.config import Settings
from vigil.faces.api.app import create_app
from vigil.model import Node
from vigil.run.engine import Engine
from vigil.sources.collect.dcgm import DcgmExporterScraper
from vigil.store.sql import Store

TEMP = "DCGM_FI_DEV_GPU_TEMP"
TOKEN = "push-window-token"


class Agent:
    """Node n01's pushes (the production dcgm-exporter scraper) through the server's app."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.scraper = DcgmExporterScraper("http://unused", node="n01")

    def push(self, ts: float, gpu0_temp: float, gpus: int = 4) -> None:
        page = dcgm_page("n01", gpus=gpus, readings={TEMP: [gpu0_temp, COOL, COOL, COOL]})
        samples = [{"ts": ts, "entity": p.entity, "metric": p.metric, "value": p.value}
                   for p in self.scraper.parse_page(page, ts).points]
        answer = self.client.post("/api/v1/samples", json={"node": "n01", "samples": samples},
                                  headers={"Idempotency-Key": uuid.uuid4().hex})
        assert answer.status_code == 201, answer.text


class Served:
    def __init__(self, store: Store, settings: Settings, client: TestClient, clock: Clock) -> None:
        self.store, self.settings, self.client, self.clock = store, settings, client, clock
        self.agent = Agent(client)

    def engine(self, batch: int = 10_000) -> Engine:
        return Engine(self.store, self.settings, notifiers=[], clock=self.clock, batch=batch)

    def rows(self) -> list[float]:
        return sorted(p.ts for p in self.store.pushes_after(0))


@pytest.fixture
def served(db_url: str, tmp_path: Path) -> Iterator[Served]:
    settings = Settings(home=tmp_path, db_url=db_url, api_token=TOKEN, resolve_after_s=120.0)
    store = Store(db_url)
    clock = Clock()
    with TestClient(create_app(store, settings=settings), headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        served = Served(store, settings, client, clock)
        served.agent.push(clock.now - 3600.0, COOL)  # the scraper learns the GPUs; a day-old push, never read
        store.register_node(Node(name="n01", gpus=list(served.agent.scraper.gpus.values())))
        with store.engine.begin() as conn:  # not there for the tests: only the scraper's GPUs were wanted
            conn.exec_driver_sql("DELETE FROM metric_pushes")
        yield served
    store.close()


def value(engine: Engine, gpu: int, metric: str = TEMP) -> float:
    frame = {f.family: f for f in engine.frames.frames(engine.clock())}["gpu"]
    return float(frame.values[frame.entities.index(f"gpu/n01/{gpu}"), frame.metrics.index(metric)])


def test_steady_state_keeps_the_pushes_of_the_window_only(served: Served) -> None:
    """25 minutes of pushes every 15 s, a tick after each: the store holds the pushes of the last 300 s (21), not
    all 101 (nothing was dropped before: only a batch spanning more than 300 s was pruned)."""
    engine = served.engine()
    for _ in range(101):
        served.agent.push(served.clock.now, COOL)
        engine.tick()
        served.clock.now += 15.0
    rows = served.rows()
    assert len(rows) == 21 and min(rows) >= served.clock.now - 15.0 - 300.0


def test_a_tick_drops_at_most_a_batch(served: Served) -> None:
    """40 pushes read, then 1000 s on: each tick drops at most one batch (5) of those out of the window."""
    engine = served.engine(batch=5)
    for _ in range(40):
        served.agent.push(served.clock.now, COOL)
    for _ in range(8):
        engine.tick()
    assert engine.push_cursor and len(served.rows()) == 40
    served.clock.now += 1000.0
    held = []
    for _ in range(9):
        engine.tick()
        held.append(len(served.rows()))
    assert held == [35, 30, 25, 20, 15, 10, 5, 0, 0] and engine.pruned_pushes == 40


def test_a_restart_replays_the_newest_pushes(served: Served) -> None:
    """Ten pushes over 135 s (GPU 0 at 60..69 C) read by an engine reading batches of 4; an engine started after it
    replays the newest four: GPU 0 at 69 C (63 C, the oldest four's, before)."""
    engine = served.engine(batch=4)
    for number in range(10):
        served.agent.push(served.clock.now, 60.0 + number)
        engine.tick()
        served.clock.now += 15.0
    assert value(engine, 0) == 69.0
    restarted = served.engine(batch=4)
    restarted.start()
    assert value(restarted, 0) == 69.0


def test_a_restart_after_the_window_replays_nothing(served: Served) -> None:
    """GPU 0 hot when the engine stopped; started again an hour later, the view holds nothing of n01 (the hour-old
    hot values before) and its first tick opens nothing."""
    engine = served.engine()
    served.agent.push(served.clock.now, HOT)
    assert engine.tick().anomalies == 1
    served.clock.now += 3600.0
    restarted = served.engine()
    restarted.start()
    assert restarted.frames.newest("n01") == -np.inf
    assert "gpu" not in {f.family for f in restarted.frames.frames(served.clock.now)}


def test_a_restart_applies_the_live_rules_to_a_clock_set_back(served: Served) -> None:
    """A node's clock an hour ahead, then set right: pushes read by an engine that kept them (one before the window
    was pruned) - a restart reads the node's later, correct push (the hour-ahead hot values held before: the replay
    ordered them by raw stamp)."""
    now = served.clock.now
    served.agent.push(now - 75.0 + 3600.0, HOT)
    served.agent.push(now - 15.0, COOL)
    (last,) = [p.id for p in served.store.pushes_after(0)][-1:]
    served.store.set_cursor("engine", 0.0, {"events": 0, "pushes": last, "ticks": 2, "at": now - 10.0})
    restarted = served.engine()
    restarted.start()
    assert value(restarted, 0) == COOL


def test_a_backlog_of_a_clock_ten_minutes_ahead_does_not_win(served: Served) -> None:
    """n01's clock 600 s ahead, the server away 300 s while GPU 0 ran hot; back, the agent sends its fresh push
    (cool) first, then its backlog: every backlog push is ahead of the server's clock yet older than the fresh one,
    and leaves the view (it was taken as made now, won, and opened gpu_thermal before)."""
    skew = 600.0
    engine = served.engine()
    for _ in range(4):
        served.agent.push(served.clock.now + skew, COOL)
        assert engine.tick().anomalies == 0
        served.clock.now += 15.0
    served.clock.now += 300.0
    served.agent.push(served.clock.now + skew, COOL)
    engine.tick()
    for age in range(285, 0, -15):
        served.agent.push(served.clock.now + skew - age, HOT)
        served.clock.now += 0.5
        report = engine.tick()
        assert report.anomalies == 0 and not report.opened and report.late == 1
        assert value(engine, 0) == COOL
    assert served.store.anomalies() == [] and engine.late_pushes == 19
    served.clock.now += 15.0
    served.agent.push(served.clock.now + skew, HOT)  # newer than all: judged
    assert engine.tick().anomalies == 1 and value(engine, 0) == HOT


def test_a_backlog_push_does_not_bring_back_a_gpu_fallen_off_the_bus(served: Served) -> None:
    """n01's clock 60 s ahead, the server away 300 s; GPU 3 fell off the bus meanwhile. The fresh push (three GPUs)
    first, then a backlog push made 30 s earlier (four): GPU 3 stays gone (brought back with the older push's
    values before)."""
    engine = served.engine()
    served.agent.push(served.clock.now + 60.0, COOL)
    engine.tick()
    served.clock.now += 300.0
    served.agent.push(served.clock.now + 60.0, COOL, gpus=3)
    engine.tick()
    assert np.isnan(value(engine, 3))
    served.agent.push(served.clock.now + 30.0, COOL)
    served.clock.now += 1.0
    report = engine.tick()
    assert np.isnan(value(engine, 3)) and value(engine, 2) == COOL
    assert report.late == 1


def metrics(client: TestClient) -> str:
    answer = client.get("/metrics")
    assert answer.status_code == 200
    return answer.text


def test_stale_and_late_pushes_on_metrics_and_the_warning_once_an_episode(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """n01's clock 400 s behind: its pushes are stale, counted on /metrics with its offset, warned once; its clock
    set right, a push is applied (the warning is re-armed); 20 minutes later its clock 400 s behind again: warned
    again (never again before), and a late push counted."""
    engine = served.engine()
    caplog.set_level(logging.WARNING, logger="vigil.engine")
    for _ in range(2):
        served.agent.push(served.clock.now - 400.0, COOL)
        engine.tick()
        served.clock.now += 15.0
    text = metrics(served.client)
    assert "vigil_engine_stale_pushes_total 2.0" in text and "vigil_engine_late_pushes_total 0.0" in text
    assert 'vigil_engine_push_offset_seconds{node="n01"} -400.0' in text
    assert len([r for r in caplog.records if "older than live_push_max_age_s" in r.message]) == 1
    served.agent.push(served.clock.now, COOL)
    served.agent.push(served.clock.now - 30.0, COOL)  # late: older than the one before
    engine.tick()
    text = metrics(served.client)
    assert "vigil_engine_late_pushes_total 1.0" in text
    assert 'vigil_engine_push_offset_seconds{node="n01"} 0.0' in text
    served.clock.now += 1200.0
    served.agent.push(served.clock.now - 400.0, COOL)
    engine.tick()
    assert len([r for r in caplog.records if "older than live_push_max_age_s" in r.message]) == 2
    assert "vigil_engine_stale_pushes_total 3.0" in metrics(served.client)
