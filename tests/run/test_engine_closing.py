"""`vigil engine` closes every database connection it opened - its store's pool and the remedy journal's engines (the
audit log's, the lifecycle's) - on its way out: after `--once`, and stopped by SIGTERM. Before, it gave its lease up
and left the pools to the process's end. Real processes, counting their own connections (``counted_connections``), on
SQLite and PostgreSQL."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.remedy.claims import database as database
from tests.remedy.held_slurm import acting_env, held_slurm, place_cluster
from tests.run.counted_connections import left_open
from tests.run.engine_process import EngineProcess
from tests.serve.conftest import postgres_url as postgres_url

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("options", [(), ("--once",)], ids=["sigterm", "once"])
def test_the_engine_closes_its_connections_at_exit(database: str, tmp_path: Path, options: tuple[str, ...]) -> None:
    place_cluster(database)
    home = tmp_path / "home"
    home.mkdir()
    with held_slurm(tmp_path / "slurm") as slurm:
        engine = EngineProcess(acting_env(home, database, slurm), *options, module="tests.run.counted_connections")
        try:
            if not options:
                wait_for(lambda: engine.said("vigil engine on"), 120, "the engine to run")
                engine.process.send_signal(signal.SIGTERM)
            assert engine.process.wait(timeout=120) == 0, engine.lines
            engine.reader.join(10)
        finally:
            engine.end()
    assert left_open(engine.lines) == 0
