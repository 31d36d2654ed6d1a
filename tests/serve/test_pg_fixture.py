"""The PostgreSQL test fixture cleans up after a killed run: a test process SIGKILLed leaves its server running
(reparented to init) in its vigil-pg-* directory, and the next fixture to start stops it and removes the directory
- but never a server whose owner is alive (a parallel run)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.serve.conftest import PG_OWNER, REPO, _postgres_bin, pg_owner_line, stop_orphaned_postgres

# A test process holding a fixture server: prints its URL and directory, then waits for its stdin to close.
HOLDER = """
import sys
from pathlib import Path
from tests.serve.conftest import running_postgres
with running_postgres(Path(sys.argv[1])) as (url, base):
    print(url, base, flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def pg_root() -> Iterator[Path]:
    """A temporary directory the postgres user can enter (pytest's tmp_path is private to root), so that this test
    sweeps its own servers only."""
    root = Path(tempfile.mkdtemp(prefix="vigil-pg-root-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def hold_a_server(root: Path) -> tuple[subprocess.Popen[str], str, Path]:
    _postgres_bin("pg_ctl")  # skips (or fails under CI) where PostgreSQL is not installed
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(root)], cwd=REPO, env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout is not None
    line = holder.stdout.readline()  # the server is up once the holder says so
    assert line, f"the holder ended with {holder.wait()} before its server was up"
    url, base = line.split()
    return holder, url.replace("postgresql+psycopg://", "postgresql://"), Path(base)


def answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)
    except psycopg.OperationalError:
        return False


def test_a_server_left_by_a_killed_run_is_stopped_and_removed_and_a_live_runs_is_not(pg_root: Path) -> None:
    orphaned, orphan_url, orphan_base = hold_a_server(pg_root)
    alive, alive_url, alive_base = hold_a_server(pg_root)
    try:
        postmaster = int((orphan_base / "data" / "postmaster.pid").read_text().split()[0])
        orphaned.send_signal(signal.SIGKILL)
        assert orphaned.wait() == -signal.SIGKILL
        # the killed run's server runs on without it (what a run killed before this fixture left under /tmp)
        assert answers(orphan_url) and (orphan_base / PG_OWNER).read_text().split()[0] == str(orphaned.pid)
        # a directory that names no owner (an older fixture's) is not judged
        unowned = pg_root / "vigil-pg-unowned"
        (unowned / "data").mkdir(parents=True)
        removed = stop_orphaned_postgres(pg_root)
        assert removed == [orphan_base] and not orphan_base.exists()
        assert not answers(orphan_url)
        assert not Path(f"/proc/{postmaster}").exists() or "zombie" in Path(f"/proc/{postmaster}/status").read_text()
        assert answers(alive_url) and alive_base.exists() and unowned.exists()
        # a later run finds nothing more to stop while the live run holds its server
        assert stop_orphaned_postgres(pg_root) == [] and answers(alive_url)
    finally:
        for holder in (orphaned, alive):
            if holder.poll() is None:
                assert holder.stdin is not None
                holder.stdin.close()  # the holder's own teardown stops its server
                holder.wait(timeout=120)
    assert not alive_base.exists() and not answers(alive_url)


def test_an_owner_whose_pid_was_reused_is_gone(pg_root: Path) -> None:
    """The owner is a pid and that process's start time: another process under the same pid is not the owner."""
    base = pg_root / "vigil-pg-reused"
    base.mkdir()
    pid, started, namespace = pg_owner_line(os.getpid()).split()
    (base / PG_OWNER).write_text(f"{pid} {int(started) - 1} {namespace}\n")
    assert stop_orphaned_postgres(pg_root) == [base] and not base.exists()
    base.mkdir()
    (base / PG_OWNER).write_text(pg_owner_line(os.getpid()))
    assert stop_orphaned_postgres(pg_root) == [] and base.exists()


def test_a_dead_servers_pid_file_naming_another_runs_server_stops_nothing(pg_root: Path) -> None:
    """A run whose server died with it (SIGKILL to both, the OOM killer) leaves a postmaster.pid behind; by the next
    run its pid may name another process - here a live run's server. The directory is removed without signalling
    that pid, and the live server answers on (pg_ctl stop signalled it, stopping a live run's server, before)."""
    alive, alive_url, alive_base = hold_a_server(pg_root)
    try:
        stale = pg_root / "vigil-pg-stale"
        (stale / "data").mkdir(parents=True)
        for name in ("PG_VERSION", "postgresql.conf", "postmaster.pid"):  # a cluster's directory as its server left it
            shutil.copy(alive_base / "data" / name, stale / "data" / name)
        if os.geteuid() == 0:  # the server's user owns its directory, as the fixture leaves it
            for path in (stale, stale / "data", *(stale / "data").iterdir()):
                shutil.chown(path, "postgres")
        pid, started, namespace = pg_owner_line(os.getpid()).split()
        (stale / PG_OWNER).write_text(f"{pid} {int(started) - 1} {namespace}\n")  # an owner that has ended
        removed = stop_orphaned_postgres(pg_root)
        assert answers(alive_url) and alive_base.exists()
        assert removed == [stale] and not stale.exists()
    finally:
        assert alive.stdin is not None
        alive.stdin.close()
        alive.wait(timeout=120)
