"""Late samples pushes cannot roll the live view back: an agent that sends its backlog after an outage (pushes up to
an hour old, each under its own Idempotency-Key) through the server's real app has every push stored once, but the
engine judges the node on its newest push - a push older than the one the live view holds of a series leaves it,
and one older than live_push_max_age_s is never judged live - so an engine tick in the middle of the replay opens
no anomaly for a past state."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.run.clock import Clock
from tests.run.pages import COOL, HOT, dcgm_page
from vigil.config import Settings
from vigil.faces.api.app import create_app
from vigil.model import Node
from vigil.run.engine import Engine
from vigil.sources.collect.dcgm import DcgmExporterScraper
from vigil.store.sql import Store

TOKEN = "late-push-token"


class Node01:
    """Node n01's agent reduced to its pushes (the production dcgm-exporter scraper), against the server's app."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.scraper = DcgmExporterScraper("http://unused", node="n01")
        self.answers: list[dict[str, int]] = []

    def push(self, ts: float, gpu0_temp: float, key: str | None = None) -> str:
        page = dcgm_page("n01", readings={"DCGM_FI_DEV_GPU_TEMP": [gpu0_temp, COOL, COOL, COOL]})
        samples = [{"ts": ts, "entity": p.entity, "metric": p.metric, "value": p.value}
                   for p in self.scraper.parse_page(page, ts).points]
        key = key or uuid.uuid4().hex
        answer = self.client.post("/api/v1/samples", json={"node": "n01", "samples": samples},
                                  headers={"Idempotency-Key": key})
        assert answer.status_code == 201, answer.text
        self.answers.append(answer.json())
        return key


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Store, Clock, Node01, Engine]]:
    settings = Settings(home=tmp_path, api_token=TOKEN, resolve_after_s=120.0)
    store = Store(settings.database_url())
    clock = Clock()
    with TestClient(create_app(store, settings=settings), headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        agent = Node01(client)
        agent.push(clock.now, COOL)  # the scraper learns the GPUs from its first page
        store.register_node(Node(name="n01", gpus=list(agent.scraper.gpus.values())))
        yield store, clock, agent, Engine(store, settings, notifiers=[], clock=clock)
    store.close()


def gpu_values(engine: Engine) -> tuple[list[str], list[str], np.ndarray]:
    (frame,) = [f for f in engine.frames.frames(engine.clock()) if f.family == "gpu"]
    return frame.entities, frame.metrics, frame.values


def temperature(engine: Engine, gpu: int) -> float:
    entities, metrics, values = gpu_values(engine)
    return float(values[entities.index(f"gpu/n01/{gpu}"), metrics.index("DCGM_FI_DEV_GPU_TEMP")])


def test_a_backlog_replayed_after_the_newest_push_leaves_the_live_view_and_opens_nothing(
        served: tuple[Store, Clock, Node01, Engine]) -> None:
    """The server was away for an hour, during which GPU 0 ran hot; it is cool now. The agent sends its newest push
    first, then its backlog oldest first - pushes 3585 s and 1800 s old (older than live_push_max_age_s) and 120, 60
    and 15 s old (within it, older than the newest) - one of them twice (its answer lost). Ticks between them read
    the newest push's values and open nothing; every push is stored once. A hot push newer than all opens the
    thermal anomaly (the rule does fire here)."""
    store, clock, agent, engine = served
    start = clock.now
    clock.now += 3600.0
    now = clock.now
    agent.push(now, COOL)  # the newest push, sent first
    first = engine.tick()
    assert first.anomalies == 0 and temperature(engine, 0) == COOL
    entities, metrics, live = gpu_values(engine)
    backlog = [now - 3585.0, now - 1800.0, now - 120.0, now - 60.0, now - 15.0]
    for number, made in enumerate(backlog):
        key = agent.push(made, HOT)
        if number == 2:
            agent.push(made, HOT, key)  # its answer lost: sent again under its key
        clock.now += 1.0
        report = engine.tick()  # a tick in the middle of the replay
        assert report.anomalies == 0 and not report.opened, f"opened for the push made {now - made:g} s ago"
        assert report.stale == (1 if made < clock.now - engine.settings.live_push_max_age_s else 0)
        assert report.late == (0 if report.stale else 1)
        assert gpu_values(engine)[:2] == (entities, metrics)
        np.testing.assert_array_equal(gpu_values(engine)[2], live)
    assert store.anomalies() == [] and store.incidents() == []
    resent = agent.answers[5]  # the fixture's push, the newest, three of the backlog, then the one sent again
    assert resent["duplicates"] == resent["stored"] > 0
    assert sum(a["duplicates"] for a in agent.answers) == resent["stored"]
    assert engine.stale_pushes == 3  # the fixture's first push, an hour before the newest, and two of the backlog
    # each push stored once; the engine dropped those it read stamped before live_push_max_age_s (the fixture's
    # and the two oldest of the backlog: their keys are kept apart)
    assert sorted(p.ts for p in store.pushes_after(0)) == sorted([now, *backlog[2:]]) and start < backlog[0]
    clock.now += 1.0
    agent.push(clock.now, HOT)  # newer than every push: judged
    report = engine.tick()
    assert report.anomalies == 1 and temperature(engine, 0) == HOT
    (anomaly,) = store.anomalies()
    assert anomaly.entity == "gpu/n01/0" and anomaly.fault_type == "gpu_thermal"


def test_a_backlog_older_than_the_live_window_sent_oldest_first_is_not_judged_live(
        served: tuple[Store, Clock, Node01, Engine]) -> None:
    """An agent that sends its backlog oldest first with nothing newer before it (an older agent): the pushes older
    than live_push_max_age_s are stored and counted, but the node keeps the values it had (cool) - an hour-old hot
    GPU is not opened as an anomaly now."""
    store, clock, agent, engine = served
    assert engine.tick().anomalies == 0
    clock.now += 3600.0
    for age in (3585.0, 2400.0, 900.0, 301.0):
        agent.push(clock.now - age, HOT)
        report = engine.tick()
        assert report.anomalies == 0 and temperature(engine, 0) == COOL
        assert report.stale == 1
    assert store.anomalies() == [] and engine.stale_pushes == 4 and engine.status()["stale_pushes"] == 4


def test_a_push_from_a_clock_ahead_does_not_hold_the_node_after_its_clock_is_set_right(
        served: tuple[Store, Clock, Node01, Engine]) -> None:
    """A node whose clock ran an hour ahead pushes (GPU 0 hot), then its clock is set right and it pushes again (cool)
    a minute later: the engine reads the cool push - a push from the future counts as made when it was read (it held
    the node's values for the hour its clock was ahead, as older than the hot push, before)."""
    store, clock, agent, engine = served
    engine.tick()
    clock.now += 15.0
    agent.push(clock.now + 3600.0, HOT)
    engine.tick()
    assert temperature(engine, 0) == HOT
    clock.now += 60.0
    agent.push(clock.now, COOL)
    report = engine.tick()
    assert temperature(engine, 0) == COOL and report.late == 0
