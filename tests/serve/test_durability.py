"""kill -9 during writes: every incident the server acknowledged (HTTP 201) is there after a restart."""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import REPO, TOKEN, free_port, fresh_database, start_server, wait_for
from vigil.model import FaultLevel, Incident
from vigil.store.sql import Store

pytestmark = pytest.mark.slow


def server_env(home: Path, db_url: str) -> dict[str, str]:
    return {**os.environ, "VIGIL_HOME": str(home), "VIGIL_API_TOKEN": TOKEN, "VIGIL_DB_URL": db_url,
            "PYTHONPATH": str(REPO)}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_no_acknowledged_incident_is_lost_after_kill_9(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        db_url = f"sqlite:///{tmp_path / 'vigil.db'}"
    else:
        db_url = fresh_database(request.getfixturevalue("postgres_url"), "durability")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    acknowledged: list[str] = []
    in_flight_failures = [0]
    for _round in range(2):
        server = start_server(tmp_path, server_env(tmp_path, db_url), port=port)
        stop = threading.Event()

        def writer(stop: threading.Event) -> None:
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as client:
                while not stop.is_set():
                    now = time.time()
                    incident = Incident(
                        title="kill -9 probe",
                        scope="node/n001",
                        entities=["node/n001"],
                        start=now,
                        end=now,
                        level=FaultLevel.DRAIN,
                        fault_types=["probe"],
                    )
                    try:
                        response = client.post("/api/v1/incidents", json=incident.model_dump(mode="json"))
                    except httpx.HTTPError:
                        in_flight_failures[0] += 1
                        return
                    if response.status_code == 201:
                        acknowledged.append(incident.id)

        threads = [threading.Thread(target=writer, args=(stop,)) for _ in range(3)]
        for thread in threads:
            thread.start()
        target = len(acknowledged) + 40
        wait_for(lambda target=target: len(acknowledged) >= target, 120, "40 acknowledged writes")
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
        stop.set()
        for thread in threads:
            thread.join()
    assert in_flight_failures[0] >= 1  # the kill really landed while writes were in flight

    server = start_server(tmp_path, server_env(tmp_path, db_url), port=port)
    try:
        with closing(Store(db_url)) as store:
            lost = [i for i in acknowledged if store.incident(i) is None]
        assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged incidents lost"
        listed = httpx.get(f"{url}/api/v1/incidents", params={"limit": 10000},
                           headers={"Authorization": f"Bearer {TOKEN}"}).json()
        assert set(acknowledged) <= {i["id"] for i in listed}
    finally:
        server.terminate()
        server.wait(timeout=30)
