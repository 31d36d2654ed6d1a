"""Alertmanager webhook payloads (version 4) into events, and a notification sent again stored once."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.serve.alertmanager_payload import PAYLOAD
from tests.serve.conftest import REPO, TOKEN
from vigil.config import Settings
from vigil.faces.api.alertmanager import alert_entity, alerts_to_events, parse_payload
from vigil.faces.api.app import create_app
from vigil.model import FaultLevel, VigilInputError
from vigil.store.sql import Store

# What Debian's Alertmanager 0.25.0 sent a webhook receiver (its externalURL renamed) for one alert posted to its
# API: firing, the same firing twice more (repeat_interval 2s), resolved (the alert posted again with an end), and
# firing again once posted with a new start - the same fingerprint throughout.
RECORDED = REPO / "tests" / "fixtures" / "serve" / "alertmanager" / "repeat_resolve_refire.json"


def test_payload_with_unknown_fields_becomes_events() -> None:
    events = alerts_to_events(parse_payload(PAYLOAD))
    assert [e.entity for e in events] == ["gpu/n003/5", "node/n004"]
    firing, resolved = events
    assert firing.kind == "alert_firing" and firing.level is FaultLevel.ISOLATE
    assert firing.message == "GpuXid: GPU has fallen off the bus"
    assert firing.attrs["labels"]["xid"] == "79" and firing.attrs["fingerprint"] == "a1b2c3"
    assert firing.ts == pytest.approx(1767226200.0)
    assert resolved.kind == "alert_resolved" and resolved.level is FaultLevel.HEALTHY
    assert resolved.ts == pytest.approx(1767225900.0)  # stamped with its end


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: p.update(version="3"), "version"),
        (lambda p: p.pop("alerts"), "alerts"),
        (lambda p: p["alerts"][0].update(status="exploded"), "status"),
        (lambda p: p["alerts"][0].update(startsAt="yesterday"), "startsAt"),
    ],
)
def test_bad_payload_is_one_clear_error(mutate: Any, message: str) -> None:
    payload = copy.deepcopy(PAYLOAD)
    mutate(payload)
    with pytest.raises(VigilInputError, match=message) as info:
        parse_payload(payload)
    assert "\n" not in str(info.value)


def test_entity_falls_back_to_job_then_cluster() -> None:
    assert alert_entity({"job_id": "j7"}) == "job/j7"
    assert alert_entity({"Hostname": "bad host;rm -rf"}, cluster="c1") == "cluster/c1"
    assert alert_entity({}) == "cluster/vigil"


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[tuple[TestClient, Store]]:
    store = Store(f"sqlite:///{tmp_path / 'vigil.db'}")
    app = create_app(store, settings=Settings(home=tmp_path, api_token=TOKEN))
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        yield client, store
    store.close()


def _notify(client: TestClient, payload: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/api/v1/alertmanager", json=payload)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_a_notification_sent_again_stores_its_alert_once(webhook: tuple[TestClient, Store]) -> None:
    """Alertmanager's own notifications in the order it sent them, the first one sent again too (its answer lost):
    the alert firing is one event however often it is repeated, its resolution one, and it firing again after it
    resolved (a new startsAt) a second firing event."""
    notifications = json.loads(RECORDED.read_text())
    assert [n["status"] for n in notifications] == ["firing", "firing", "firing", "resolved", "firing"]
    assert len({a["fingerprint"] for n in notifications for a in n["alerts"]}) == 1
    client, store = webhook
    answers = [_notify(client, n) for n in [notifications[0], *notifications]]
    firing, resolved = store.events(kind="alert_firing"), store.events(kind="alert_resolved")
    assert [(a["stored"], a["duplicates"]) for a in answers] == [(1, 0), (1, 1), (1, 1), (1, 1), (1, 0), (1, 0)]
    assert [a["entities"] for a in answers] == [["gpu/n003/5"]] * 6
    starts = [n["alerts"][0]["startsAt"] for n in notifications]
    assert [e.ts for e in firing] == [parse_payload(notifications[i]).alerts[0].starts_at.timestamp() for i in (0, 4)]
    assert starts[0] != starts[4] and len(resolved) == 1 and resolved[0].entity == "gpu/n003/5"


def test_what_may_change_between_two_notifications_of_one_alert_is_not_a_new_alert(
    webhook: tuple[TestClient, Store],
) -> None:
    """Between two notifications of one firing alert Prometheus may have re-evaluated its annotations, another
    route may deliver it (group key, receiver) and its endsAt moves: still the same alert. Another alert (another
    fingerprint) with the same start is another event."""
    client, store = webhook
    first = json.loads(RECORDED.read_text())[0]
    again = copy.deepcopy(first)
    again.update(groupKey='{}/{severity="critical"}:{alertname="GpuXid"}', receiver="vigil-pager")
    again["alerts"][0]["annotations"]["summary"] = "GPU has fallen off the bus (Xid 79, seen 3 times)"
    again["alerts"][0]["endsAt"] = "2026-12-07T01:53:35Z"
    other = copy.deepcopy(first)
    other["alerts"][0].update(fingerprint="5f1e0c2b9d7a4e61", labels={**first["alerts"][0]["labels"], "gpu": "6"})
    answers = [_notify(client, p) for p in (first, again, other)]
    assert [a["duplicates"] for a in answers] == [0, 1, 0]
    assert sorted(e.entity for e in store.events(kind="alert_firing")) == ["gpu/n003/5", "gpu/n003/6"]


def test_an_alert_without_a_fingerprint_is_known_by_its_labels(webhook: tuple[TestClient, Store]) -> None:
    client, store = webhook
    payload = copy.deepcopy(PAYLOAD)
    for alert in payload["alerts"]:
        alert.pop("fingerprint")
    other_gpu = copy.deepcopy(payload)
    other_gpu["alerts"][0]["labels"]["gpu"] = "6"
    answers = [_notify(client, p) for p in (payload, payload, other_gpu)]
    assert [(a["stored"], a["duplicates"]) for a in answers] == [(2, 0), (2, 2), (2, 1)]
    assert len(store.events(limit=100)) == 3


def _alert_counters(client: TestClient) -> dict[tuple[str, str], float]:
    page = client.get("/metrics").text
    return {(s.name, s.labels["status"]): s.value for family in text_string_to_metric_families(page)
            if family.name.startswith("vigil_alertmanager_") for s in family.samples if s.name.endswith("_total")}


def test_the_alerts_counter_counts_each_alert_once_and_the_repeats_apart(webhook: tuple[TestClient, Store]) -> None:
    """The recorded notifications, the first sent twice: two firing alerts (two starts) and one resolution are
    counted in vigil_alertmanager_alerts_total, the three notifications that repeat a stored alert in
    vigil_alertmanager_alert_repeats_total."""
    client, _ = webhook
    notifications = json.loads(RECORDED.read_text())
    for notification in [notifications[0], *notifications]:
        _notify(client, notification)
    assert _alert_counters(client) == {
        ("vigil_alertmanager_alerts_total", "firing"): 2.0, ("vigil_alertmanager_alerts_total", "resolved"): 1.0,
        ("vigil_alertmanager_alert_repeats_total", "firing"): 3.0,
        ("vigil_alertmanager_alert_repeats_total", "resolved"): 0.0}
