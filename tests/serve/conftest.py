"""Fixtures for the server tests: a store filled by the simulator and the pipeline, a server on loopback,
real binaries (Prometheus, Chromium, PostgreSQL) found or - in CI - loudly missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests import pg_connections
from tests.conftest import free_port, require_binary, wait_for
from vigil.config import Settings
from vigil.faces.api.auth import TOKEN_COOKIE, User, hash_token, save_users
from vigil.model import Cause, Diagnosis, Incident, RemediationStep
from vigil.run.pipeline import PipelineResult, run_pipeline
from vigil.sources.sim import SimConfig, SimRun, simulate
from vigil.store.metrics import MetricFrame, MetricStore
from vigil.store.sql import Store

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
TOKEN = "test-token-7f3a"  # the shared api_token: the identity "api", admin
# A second person for the two-person rule: what "api" proposes, "ada" approves.
APPROVER = "ada"
APPROVER_TOKEN = "test-approver-91c2"
APPROVER_AUTH = {"Authorization": f"Bearer {APPROVER_TOKEN}"}
STRAGGLER_RANK = 5


@dataclass
class SimCluster:
    run: SimRun
    result: PipelineResult
    store: Store
    metrics: MetricStore
    home: Path
    incident: Incident
    diagnosis: Diagnosis

    def settings(self, **overrides: object) -> Settings:
        values: dict[str, object] = {"home": self.home, "db_url": self.store.url, "api_token": TOKEN,
                                     "users_file": approvers_file(self.home)}
        values.update(overrides)
        return Settings(**values)  # type: ignore[arg-type]


def approvers_file(home: Path) -> Path:
    """The users file of the test servers: one approver beside the shared token."""
    path = home / "approvers.yaml"
    if not path.exists():
        save_users(path, [User(name=APPROVER, role="approver", token_sha256=hash_token(APPROVER_TOKEN))])
    return path


def reader_cookies() -> dict[str, str]:
    """What a signed-in dashboard sends on page loads: the token cookie, which opens reads only."""
    return {TOKEN_COOKIE: TOKEN}


def rank_frames(run: SimRun, metrics: MetricStore) -> None:
    """Per-rank step times, as the training probe reports them: each rank's step time is the job's plus
    a little jitter; rank 5 of job j00 runs 40% slow (a straggler the job view must show)."""
    rng = np.random.default_rng(7)
    job = run.topology.jobs[0]
    ts, job_values = metrics.series(job.entity, "vigil_job_step_time_seconds")
    entities = [f"job/{job.id}/rank/{r}" for r in range(job.world_size)]
    for t, value in zip(ts, job_values, strict=True):
        per_rank = np.full((len(entities), 1), value, dtype=np.float32)
        per_rank[:, 0] *= 1.0 + 0.02 * rng.standard_normal(len(entities)).astype(np.float32)
        per_rank[STRAGGLER_RANK, 0] *= 1.4
        metrics.append(
            MetricFrame(
                ts=float(t), family="rank", entities=entities, metrics=["vigil_job_step_time_seconds"], values=per_rank
            )
        )


def diagnosis_for(incident: Incident) -> Diagnosis:
    """A diagnosis record as the RCA stage writes it, made by hand from the incident's own evidence."""
    refs = [e.ref for e in incident.evidence[:2]]
    root = Cause(
        entity=incident.scope,
        fault_type=incident.fault_types[0],
        score=0.82,
        explanation="first fault in time on the incident's scope",
        evidence_refs=refs,
    )
    other = Cause(
        entity=incident.entities[-1],
        fault_type=incident.fault_types[-1],
        score=0.11,
        explanation="a symptom downstream of the root cause",
    )
    plan = [
        RemediationStep(
            action="cordon",
            target=f"node/{incident.scope.split('/')[1]}",
            risk="medium",
            reason="keep new work off the node",
        ),
        RemediationStep(
            action="reset_gpu",
            target=incident.scope if incident.scope.startswith("gpu/") else f"node/{incident.scope.split('/')[1]}",
            risk="high",
            reason="clear the fault",
        ),
    ]
    return Diagnosis(
        incident_id=incident.id,
        summary=f"{incident.fault_types[0]} on {incident.scope}",
        root_cause=root,
        confidence=0.8,
        causes=[other, root],
        evidence_refs=refs,
        plan=plan,
    )


def build_cluster(url: str, home: Path) -> SimCluster:
    run = simulate(SimConfig(nodes=8, gpus=8, minutes=60, seed=1))
    store = Store(url)
    result = run_pipeline(run, store=store, metrics=MetricStore(home / "metrics"))
    rank_frames(run, result.metrics)
    result.metrics.flush()
    incident = max(result.incidents, key=lambda i: (i.level, len(i.evidence)))
    diagnosis = diagnosis_for(incident)
    store.save_diagnosis(diagnosis)
    return SimCluster(run, result, store, result.metrics, home, incident, diagnosis)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> SimCluster:
    home = tmp_path_factory.mktemp("vigil-home")
    return build_cluster(f"sqlite:///{home / 'vigil.db'}", home)


@contextmanager
def serve_in_thread(app: object) -> Iterator[str]:
    """Run an ASGI app under uvicorn on a free loopback port; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))  # type: ignore[arg-type]
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 30, "uvicorn to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def start_server(home: Path, env: Mapping[str, str], *options: str, port: int | None = None,
                 own_group: bool = False, module: str = "vigil") -> subprocess.Popen[bytes]:
    """`vigil serve --port PORT OPTIONS` as a process (a free port unless ``port``), its stderr appended to
    HOME/serve.log, once it answers /api/v1/health; ending before that fails the test with the log. ``own_group``:
    in a session and process group of its own, as a terminal's foreground job is, for os.killpg. ``module``: what
    ``python -m`` runs (``tests.run.counted_connections``: `vigil` counting its connections)."""
    port = free_port() if port is None else port
    home.mkdir(parents=True, exist_ok=True)
    with (home / "serve.log").open("ab") as log:  # the process has its own copy: this one is closed at once
        process = subprocess.Popen([sys.executable, "-m", module, "serve", "--port", str(port), *options], cwd=REPO,
                                   env=dict(env), stdout=subprocess.DEVNULL, stderr=log, start_new_session=own_group)

    def healthy() -> bool:
        assert process.poll() is None, (home / "serve.log").read_text()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(healthy, 120, "vigil serve to answer /api/v1/health")
    return process


def _postgres_bin(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return require_binary(str(found[-1]) if found else name)


# Each fixture server's directory (``vigil-pg-*`` under the temporary directory) holds its owner: the test process
# that started it, as "<pid> <start time> <pid namespace>", so that a later run can tell a server whose owner was
# killed (SIGKILL leaves no teardown; the server, reparented to init, runs on) from one a live run is using.
PG_PREFIX = "vigil-pg-"
PG_OWNER = "owner"


def _process_started(pid: int) -> str | None:
    """When ``pid`` started (clock ticks after boot, /proc/<pid>/stat's 22nd field), or None when no such process
    runs: with the pid, it names one process, not whichever later reuses its number."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def pg_owner_line(pid: int) -> str:
    return f"{pid} {_process_started(pid)} {_pid_namespace()}\n"


def _owner_gone(base: Path) -> bool:
    """True only when ``base`` names its owner and that process has ended: no owner recorded (an older fixture's
    directory, or one being set up), an owner in another pid namespace (another container sharing /tmp) or an
    owner alive all say no."""
    try:
        pid_text, started, namespace = (base / PG_OWNER).read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return False
    if namespace != _pid_namespace():
        return False
    return _process_started(pid) != started


def _postmaster_of(data: Path) -> bool:
    """Whether the process ``data``'s postmaster.pid names runs as that data directory's server: a PostgreSQL
    server works in its data directory (/proc/<pid>/cwd), so a pid reused by any other process, another run's
    server included, is not it. One whose directory cannot be read is taken for it (nothing is removed then)."""
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    try:
        return os.readlink(f"/proc/{pid}/cwd") == str(data.resolve())
    except FileNotFoundError:
        return False  # no such process
    except OSError:
        return True


def _as_postgres() -> list[str]:
    """PostgreSQL refuses to run as root: as root, its commands run as Debian's postgres user."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def stop_orphaned_postgres(root: Path | None = None) -> list[Path]:
    """Stop (``pg_ctl stop`` on its data directory, which signals the postmaster its postmaster.pid names) every
    fixture server under ``root`` whose owner has ended, and remove its directory; returns the directories
    removed. A server whose owner runs - a parallel test run - is left alone, and so is a directory that names no
    owner."""
    pg_ctl = _postgres_bin("pg_ctl")
    removed = []
    for base in sorted(Path(root or tempfile.gettempdir()).glob(f"{PG_PREFIX}*")):
        if not _owner_gone(base):
            continue
        data = base / "data"
        if (data / "postmaster.pid").exists() and not _postmaster_of(data):
            # a postmaster.pid its server left when it died too (SIGKILL, the OOM killer, a reboot): its pid may
            # name another process by now - another run's server - which pg_ctl stop would signal all the same
            shutil.rmtree(base, ignore_errors=True)
            removed.append(base)
            continue
        if (data / "postmaster.pid").exists():
            as_user = _as_postgres()
            subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "fast", "-w", "-t", "60", "stop"],
                           capture_output=True)
            if subprocess.run([*as_user, pg_ctl, "-D", str(data), "status"], capture_output=True).returncode != 3:
                continue  # still running (or not ours to read): its directory stays
        shutil.rmtree(base, ignore_errors=True)
        removed.append(base)
    return removed


@contextmanager
def running_postgres(root: Path | None = None) -> Iterator[tuple[str, Path]]:
    """A throwaway PostgreSQL cluster (Debian's binaries) on a loopback port, trust auth, stopped and removed after;
    yields its URL and directory. Servers earlier runs left behind (their owner killed) are stopped first."""
    initdb, pg_ctl = _postgres_bin("initdb"), _postgres_bin("pg_ctl")
    stop_orphaned_postgres(root)
    # Not under pytest's tmp dir: that is private to root, and the server runs as another user.
    base = Path(tempfile.mkdtemp(prefix=PG_PREFIX, dir=root))
    (base / PG_OWNER).write_text(pg_owner_line(os.getpid()))
    data, sockets = base / "data", base / "sockets"
    sockets.mkdir()
    as_user = _as_postgres()
    if as_user:
        shutil.chown(base, "postgres")
        shutil.chown(sockets, "postgres")
    port = free_port()
    try:
        subprocess.run([*as_user, initdb, "-D", str(data), "-U", "vigil", "--auth=trust", "-E", "UTF8"], check=True,
                       capture_output=True)
        options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=on"
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-o", options, "-l", str(base / "log"), "-w", "start"],
                       check=True, capture_output=True)
        yield f"postgresql+psycopg://vigil@127.0.0.1:{port}/postgres", base
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL cluster for the session (``running_postgres``)."""
    with running_postgres() as (url, _base):
        pg_connections.MONITOR.watch(url)
        try:
            yield url
        finally:
            pg_connections.MONITOR.forget(url)


def fresh_database(postgres_url: str, name: str) -> str:
    """A new, empty database on the session's PostgreSQL server, so tests do not see each other's rows."""
    import psycopg

    server = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return postgres_url.rsplit("/", 1)[0] + f"/{name}"


@dataclass
class BigCluster:
    """The 10,000-GPU demo cluster (1,250 nodes x 8 GPUs), run through the same path as `vigil demo`."""

    run: SimRun
    store: Store
    metrics: MetricStore
    home: Path

    def settings(self, **overrides: object) -> Settings:
        values: dict[str, object] = {"home": self.home, "db_url": self.store.url, "api_token": TOKEN,
                                     "users_file": approvers_file(self.home)}
        values.update(overrides)
        return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def cluster_10k(tmp_path_factory: pytest.TempPathFactory) -> BigCluster:
    """Built once per test session (about half a minute): every dashboard view is tested at this size."""
    home = tmp_path_factory.mktemp("vigil-10k")
    run = simulate(SimConfig(nodes=1250, gpus=8, minutes=30, seed=0))
    store = Store(f"sqlite:///{home / 'vigil.db'}")
    result = run_pipeline(run, store=store, metrics=MetricStore(home / "metrics"))
    result.metrics.flush()
    return BigCluster(run, store, result.metrics, home)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, driven by Playwright; one per test module, since Playwright's sync API
    holds an event loop on the main thread while it runs and later modules run their own (asyncio.run)."""
    chromium = require_binary("/usr/bin/chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        yield instance
        instance.close()


@contextmanager
def held_diagnosis(app: Any, incident_id: str | None = None,
                   within_s: float = 120.0) -> Iterator[tuple[threading.Event, threading.Event]]:
    """The app's background diagnosis held up inside its computation - of ``incident_id`` only, where given - until
    the first event is set; the second is set once a held computation has begun. Released and restored on leaving,
    whatever happened."""
    diagnoser = app.state.ctx.diagnoser
    release, begun = threading.Event(), threading.Event()
    compute = diagnoser.compute

    def gated(diagnosed: str) -> Diagnosis:
        if incident_id is None or diagnosed == incident_id:
            begun.set()
            assert release.wait(within_s)
        return compute(diagnosed)  # type: ignore[no-any-return]

    diagnoser.compute = gated
    try:
        yield release, begun
    finally:
        release.set()
        diagnoser.compute = compute
