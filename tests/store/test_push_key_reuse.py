"""An agent's Idempotency-Key names one samples push: the push sent again is a duplicate, and the key sent again
with other samples - a sender that reuses keys (a counter reset at restart, a timestamp of one second's
resolution) - is refused with 422 naming the conflict, as the IETF Idempotency-Key header draft answers it, not
answered as a duplicate while its samples are dropped."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from fastapi.testclient import TestClient

from tests.store.conftest import api_client, opened
from tests.store.revisions import upgrade_to
from vigil.faces.api.push_keys import samples_key

LOOK = 1767226200.5
# The key of a push stored before revision 0010, which kept no digest of the push.
OLD_KEY = "stored-before-0010"


def _key_stored_at_revision_0009(url: str) -> None:
    """The key of node n01's push of load 9.0 as the samples route stored it at revision 0009 (without a digest)."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        upgrade_to(conn, "0009")
        conn.execute(sa.text("INSERT INTO metric_push_keys (push_key, stored_at) VALUES (:key, :now)"),
                     {"key": samples_key("n01", OLD_KEY), "now": time.time()})
        conn.commit()
    engine.dispose()


def test_a_key_sent_with_other_samples_is_refused(db_url: str, tmp_path: Path) -> None:
    _key_stored_at_revision_0009(db_url)

    def push(client: TestClient, load: float, key: str, node: str = "n01") -> httpx.Response:
        body: dict[str, Any] = {"node": node, "samples": [{"ts": LOOK, "entity": f"node/{node}",
                                                           "metric": "vigil_node_load1", "value": load}]}
        return client.post("/api/v1/samples", json=body, headers={"Idempotency-Key": key})

    with opened(db_url) as store, api_client(store, tmp_path) as client:
        first, reused, again = push(client, 1.0, "7"), push(client, 2.0, "7"), push(client, 1.0, "7")
        other_node = push(client, 2.0, "7", node="n02")
        old_key_again = push(client, 3.0, OLD_KEY)
        stored = sorted((p.node, p.points[0][2]) for p in store.pushes_after(0))
    assert (first.status_code, first.json()) == (201, {"stored": 1, "duplicates": 0})
    assert reused.status_code == 422, reused.text
    assert "Idempotency-Key '7' of node 'n01'" in reused.json()["detail"]
    assert (again.status_code, again.json()) == (201, {"stored": 1, "duplicates": 1})
    assert (other_node.status_code, other_node.json()) == (201, {"stored": 1, "duplicates": 0})
    # a key without a digest says nothing of its push: taken for the push sent again, as before revision 0010
    assert (old_key_again.status_code, old_key_again.json()) == (201, {"stored": 1, "duplicates": 1})
    assert stored == [("n01", 1.0), ("n02", 2.0)]

