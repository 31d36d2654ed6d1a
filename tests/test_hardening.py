"""Regression tests for the hardening cases: nothing stored is lost, no code runs from data, every bad input is
one line and exit status 2, terminal-safe output, no wrong successes."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import free_port
from vigil.faces.cli.output import SafeConsole, SafeFormatter, terminal_safe
from vigil.model import VigilInputError

VIGIL = [sys.executable, "-m", "vigil"]


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def vigil(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """The `vigil` entry point run in this process, as a user runs it (argv, environment, exit status)."""
    from vigil.config import settings
    from vigil.faces.cli.main import main

    def run(*args: str, home: Path, env: dict[str, str] | None = None) -> Ran:
        with monkeypatch.context() as patch:
            patch.setenv("VIGIL_HOME", str(home))
            patch.setenv("COLUMNS", "200")
            for key, value in (env or {}).items():
                patch.setenv(key, value)
            patch.setattr(sys, "argv", ["vigil", *args])
            settings.cache_clear()
            capsys.readouterr()
            try:
                main()
                code = 0
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else 1
            finally:
                settings.cache_clear()
            out = capsys.readouterr()
        return Ran(code, out.out, out.err)

    return run


def subprocess_vigil(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VIGIL_HOME": str(home), "COLUMNS": "200"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    return subprocess.run([*VIGIL, *args], capture_output=True, text=True, env=env, timeout=300)


def one_line_error(proc: Ran, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


# ----------------------------------------------------------------------------- terminal safety


def test_terminal_safe_escapes_controls_and_bidi_but_keeps_text() -> None:
    assert terminal_safe("ok\x1b[2J\x07\x9b\u202etxt\tend\n") == "ok\\x1b[2J\\x07\\x9b\\u202etxt\tend\n"
    assert terminal_safe("GPU 3 Xid 79: fallen off the bus") == "GPU 3 Xid 79: fallen off the bus"


def test_safe_console_keeps_its_own_colours_and_escapes_the_data(tmp_path: Path) -> None:
    out = tmp_path / "tty"
    with out.open("w") as fh:
        console = SafeConsole(file=fh, force_terminal=True, color_system="standard", width=200)
        console.print("[red]level[/] ", "line\x1b]0;owned\x07\x1b[2J", highlight=False)
    text = out.read_text()
    assert "\x1b[31m" in text  # Rich's own styling survives
    assert "\\x1b]0;owned" in text and "\\x1b[2J" in text and "\x1b[2J" not in text and "\x07" not in text


def test_agent_log_warnings_escape_exporter_bytes() -> None:
    import logging

    record = logging.LogRecord("vigil", logging.WARNING, __file__, 1, "corrupt page: %s", ("x\x1b[2Jy",), None)
    assert SafeFormatter("%(message)s").format(record) == "corrupt page: x\\x1b[2Jy"


def test_logs_triage_prints_no_escape_sequence_from_a_log_line(tmp_path: Path) -> None:
    logs = tmp_path / "job"
    logs.mkdir()
    (logs / "rank0.log").write_text(
        "step 1 loss 2.0\nRuntimeError: CUDA error: an illegal memory access was encountered \x1b[2J\x1b]0;x\x07\n"
    )
    (logs / "rank1.log").write_text("step 1 loss 2.0\nRuntimeError: NCCL communicator was aborted \x1b[31m\n")
    proc = subprocess_vigil("logs", "triage", str(logs), home=tmp_path / "home")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "\\x1b" in proc.stdout  # the bytes are shown, escaped


# ----------------------------------------------------------------------------- nothing stored is lost


def _incident(incident_id: str = "inc-ext-1", title: str = "Xid 79 on gpu/n1/0") -> dict[str, object]:
    return {"id": incident_id, "title": title, "scope": "node/n1", "entities": ["gpu/n1/0"], "start": 100.0,
            "end": 160.0, "level": 4, "fault_types": ["gpu_fallen_off_bus"]}


@pytest.fixture
def api(tmp_path: Path):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    from vigil.config import Settings
    from vigil.faces.api.app import create_app
    from vigil.store.sql import Store

    store = Store(f"sqlite:///{tmp_path / 'vigil.db'}")
    with TestClient(create_app(store, settings=Settings(home=tmp_path, api_token="shared-7"))) as client:
        client.headers["Authorization"] = "Bearer shared-7"
        yield client, store


def test_post_incident_with_an_existing_id_is_409_and_changes_nothing(api) -> None:  # type: ignore[no-untyped-def]
    client, store = api
    assert client.post("/api/v1/incidents", json=_incident()).status_code == 201
    acked = client.post("/api/v1/incidents/inc-ext-1/status", json={"status": "acknowledged"})
    assert acked.status_code == 200 and acked.json()["status"] == "acknowledged"
    again = client.post("/api/v1/incidents", json=_incident(title="replacement"))
    assert again.status_code == 409 and "already exists" in again.json()["detail"]
    kept = store.incident("inc-ext-1")
    assert kept is not None and kept.title == "Xid 79 on gpu/n1/0" and kept.status.value == "acknowledged"
    audit = store.events(kind="incident_status")
    assert [(e.attrs["from"], e.attrs["to"], e.attrs["by"]) for e in audit] == [("open", "acknowledged", "api")]


@pytest.mark.parametrize("bad_id", ["inc-../../etc", "../x", "inc/1", "", "a" * 65, "inc 1"])
def test_incident_ids_are_validated(api, bad_id: str) -> None:  # type: ignore[no-untyped-def]
    client, store = api
    answer = client.post("/api/v1/incidents", json=_incident(incident_id=bad_id))
    assert answer.status_code == 422, answer.text
    assert store.count_incidents() == 0


def test_demo_with_bad_minutes_leaves_the_demo_store_alone(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "DEMO").write_text("demo store\n")
    (home / "vigil.db").write_bytes(b"previous demo")
    for minutes in ("nan", "inf", "-1"):
        one_line_error(vigil("demo", "--minutes", minutes, "--home", str(home), home=home), "--minutes")
    assert (home / "vigil.db").read_bytes() == b"previous demo"


def test_read_commands_create_nothing(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    home = tmp_path / "never"
    for args in (["incidents", "--json"], ["nodes", "--json"], ["remedy", "audit", "--json"],
                 ["remedy", "lifecycle", "--json"], ["runs", "ls", "--json"]):
        proc = vigil(*args, home=home)
        assert proc.returncode == 0 and json.loads(proc.stdout) == [], proc.stderr
    assert not home.exists()
    one_line_error(vigil("diagnose", "incident", "inc-1", home=home), "nothing is stored")
    assert not home.exists()


# ----------------------------------------------------------------------------- no code runs from data


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_asd_pickle_that_names_a_function_is_refused_without_running_it(tmp_path: Path) -> None:
    from vigil_eval.datasets import load_asd

    marker = tmp_path / "ran"
    processed = tmp_path / "asd" / "processed"
    processed.mkdir(parents=True)
    for part in ("test", "test_label"):
        (processed / f"omi-1_{part}.pkl").write_bytes(pickle.dumps(_Exploit(marker)))
    with pytest.raises(VigilInputError, match="refusing to load class posix.system"):
        load_asd(tmp_path / "asd")
    assert not marker.exists()


def test_flight_recorder_and_asd_share_the_data_only_unpickler() -> None:
    import numpy as np

    from vigil.diagnose import flight_recorder
    from vigil.store import safe_pickle

    assert flight_recorder.DataOnlyUnpickler is safe_pickle.DataOnlyUnpickler
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.array_equal(safe_pickle.load_array(pickle.dumps(array), "a"), array)
    with pytest.raises(VigilInputError, match="refusing"):
        safe_pickle.load_data(pickle.dumps(array), "fr dump")  # an FR dump holds no numpy at all


# ----------------------------------------------------------------------------- one line, exit 2


def test_bad_environment_and_paths_are_one_line(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    one_line_error(vigil("incidents", home=tmp_path, env={"VIGIL_CONFIG": str(tmp_path)}), "config file")
    one_line_error(vigil("incidents", home=a_file), "is a file")
    one_line_error(vigil("sim", "--out", str(a_file), "--minutes", "1", "--nodes", "1", home=tmp_path), "--out")
    one_line_error(vigil("agent", "--port", "99999", home=tmp_path), "--port")
    one_line_error(vigil("incidents", "--limit", "-1", home=tmp_path), "--limit")  # not "no limit"
    one_line_error(vigil("inspect", "--count", "1", "--out", str(tmp_path), home=tmp_path), "--out")
    for args in (["checkpoint", "ls", str(a_file)], ["checkpoint", "clean", str(a_file)],
                 ["runs", "index", str(a_file)]):  # it exists: the message must not say it does not
        one_line_error(vigil(*args, home=tmp_path), f"{a_file} is not a directory")
    one_line_error(vigil("inspect", "--count", "1", "--anomalies", str(tmp_path), home=tmp_path), "--anomalies")


def test_corrupt_store_and_binary_inputs_are_one_line(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "vigil.db").write_bytes(os.urandom(4096))
    one_line_error(vigil("remedy", "audit", home=home), "cannot open the store")
    one_line_error(vigil("remedy", "lifecycle", home=home), "cannot open the store")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    clean = tmp_path / "clean"
    one_line_error(vigil("remedy", "apply", str(binary), home=clean), "not UTF-8")
    one_line_error(vigil("remedy", "act", "cordon", "node/n1", "--topology", str(binary), "--backend", "slurm",
                         home=clean), "topology file")
    one_line_error(vigil("remedy", "act", "cordon", "node/n1", "--backend", "kubernetes", home=clean,
                         env={"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path)}), "Kubernetes")


def test_logs_parse_state_must_be_a_miner_state(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    log = tmp_path / "a.log"
    log.write_text("hello 1\nhello 2\n")
    one_line_error(vigil("logs", "parse", str(log), "--state", str(tmp_path), home=tmp_path), "not a file")
    listed = tmp_path / "state.json"
    listed.write_text("[1, 2]")
    one_line_error(vigil("logs", "parse", str(log), "--state", str(listed), home=tmp_path), "not a valid miner")
    assert listed.read_text() == "[1, 2]"


def test_servers_on_a_port_in_use_are_one_line(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = str(holder.getsockname()[1])
    try:
        one_line_error(vigil("serve", "--port", port, home=tmp_path), f"port {port}")
        one_line_error(vigil("mcp", "--transport", "http", "--port", port, home=tmp_path), f"port {port}")
    finally:
        holder.close()


def test_binding_beyond_loopback_without_auth_warns(capsys: pytest.CaptureFixture[str]) -> None:
    from vigil.faces.cli.listen import warn_if_open

    warn_if_open("127.0.0.1", False, "vigil serve")
    warn_if_open("0.0.0.0", True, "vigil serve")
    assert capsys.readouterr().err == ""
    warn_if_open("0.0.0.0", False, "vigil serve")
    assert "without authentication" in capsys.readouterr().err


def test_the_shared_token_is_deprecated_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    from vigil.faces.cli.serve import warn_shared_token

    warn_shared_token("")
    assert capsys.readouterr().err == ""
    warn_shared_token("shared-7")
    err = capsys.readouterr().err
    assert "one shared identity" in err and "vigil users add" in err


# ----------------------------------------------------------------------------- wrong successes


def _topology(path: Path) -> Path:
    from vigil.model import Gpu, Node, Topology

    topo = Topology(cluster="t", nodes=[Node(name=f"n{i}", switch="s0", gpus=[Gpu(node=f"n{i}", index=0)])
                                        for i in range(1, 5)])
    path.write_text(topo.model_dump_json())
    return path


def test_act_without_an_actuator_or_on_an_unknown_node_fails(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    topology = _topology(tmp_path / "topo.json")
    one_line_error(vigil("remedy", "act", "cordon", "node/n014", home=tmp_path), "no actuator handles cordon")
    one_line_error(vigil("remedy", "act", "cordon", "node/n014", "--backend", "slurm", "--topology",
                         str(topology), home=tmp_path), "node/n014 is not in the topology")
    audit = vigil("remedy", "audit", "--json", home=tmp_path)
    assert json.loads(audit.stdout) == []  # a mistaken command line leaves no audit record


def test_agent_once_reports_missing_kernel_log_and_dead_exporter_as_down(
    tmp_path: Path, vigil: Callable[..., Ran]
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}/metrics"
    proc = vigil("agent", "--once", "--json", "--kmsg-file", str(tmp_path / "nonexistent"), "--dcgm-url", dead,
                 home=tmp_path, env={"VIGIL_AGENT_PORT": "0"})
    assert proc.returncode == 0, proc.stderr
    sources = {s["name"]: s for s in json.loads(proc.stdout)["sources"]}
    kernel = next(s for s in sources.values() if s["kind"] == "kernel" or "kmsg" in s["name"])
    exporter = next(s for s in sources.values() if "dcgm" in s["name"])
    assert kernel["up"] is False and exporter["up"] is False


# ----------------------------------------------------------------------------- UX


def test_version(tmp_path: Path) -> None:
    from vigil import __version__

    proc = subprocess_vigil("--version", home=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == f"vigil {__version__}"


def test_diagnose_incident_formats_are_exclusive(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    one_line_error(vigil("diagnose", "incident", "inc-1", "--json", "--html", home=tmp_path), "--json and --html")


def strict_json(text: str) -> object:
    """Parse as JSON parsers other than Python's do: the bare tokens NaN / Infinity are not JSON."""
    def refuse(token: str) -> object:
        raise ValueError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_json_output_is_strict_json_when_a_loss_is_nan(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    from torch.utils.tensorboard import SummaryWriter

    for run, last in (("a", 0.5), ("b", float("nan"))):
        writer = SummaryWriter(str(tmp_path / "tb" / run))
        for step in range(5):
            writer.add_scalar("loss", 2.0 / (1 + step) if step < 4 else last, step)
        writer.close()
    findings = vigil("logs", "scalars", str(tmp_path / "tb" / "b"), "--json", home=tmp_path)
    assert findings.returncode == 0, findings.stderr
    assert [(f["fault_type"], f["value"]) for f in strict_json(findings.stdout)] == [("nan_loss", None)]
    assert vigil("runs", "index", str(tmp_path / "tb"), "--json", home=tmp_path).returncode == 0
    compared = vigil("runs", "compare", "a", "b", "--tag", "loss", "--json", home=tmp_path)
    assert compared.returncode == 0, compared.stderr
    assert [series["values"][-1] for series in strict_json(compared.stdout)] == [0.5, None]


def test_serve_leaves_the_engine_off_on_a_demo_store_unless_asked(
        tmp_path: Path, vigil: Callable[..., Ran], monkeypatch: pytest.MonkeyPatch) -> None:
    """The live engine judges a demo's simulated incidents by the wall clock and re-reads its events: on the
    demo store it would resolve every incident and open each one a second time."""
    import uvicorn

    from vigil.run import engine as live_engine

    started: list[bool] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda server, sockets=None: setattr(server, "started", True))
    # What the server's shutdown reads of its engine: no remediator, the lease from settings, the stop event.
    fake = SimpleNamespace(remediator=None, settings=SimpleNamespace(remedy_lease_s=30.0), stop=threading.Event())
    monkeypatch.setattr(live_engine, "Engine", lambda *args, **kwargs: fake)
    monkeypatch.setattr(live_engine, "start_in_thread", lambda engine: started.append(True))
    monkeypatch.setattr(live_engine, "stop_in_thread", lambda engine, loop: True)
    demo, plain = tmp_path / "demo", tmp_path / "plain"
    demo.mkdir()
    (demo / "DEMO").write_text("demo store\n")
    ran = vigil("serve", "--port", str(free_port()), home=demo)
    assert ran.returncode == 0 and started == [] and "`vigil demo` run" in ran.stderr, ran.stderr
    assert vigil("serve", "--port", str(free_port()), "--engine", home=demo).returncode == 0 and started == [True]
    assert vigil("serve", "--port", str(free_port()), home=plain).returncode == 0 and started == [True, True]


def test_engine_refuses_a_demo_store_unless_asked(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    """`vigil engine` on the demo's store would open its incidents again and resolve them by the wall clock."""
    demo, plain = tmp_path / "demo", tmp_path / "plain"
    demo.mkdir()
    (demo / "DEMO").write_text("demo store\n")
    refused = vigil("engine", "--once", home=demo)
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout
    assert len(refused.stderr.strip().splitlines()) == 1 and "`vigil demo` run" in refused.stderr, refused.stderr
    assert not (demo / "vigil.db").exists()
    asked = vigil("engine", "--once", "--on-demo-store", home=demo)
    assert asked.returncode == 0 and asked.stdout.startswith("events 0"), asked.stderr
    assert vigil("engine", "--once", home=plain).returncode == 0


def test_progress_bars_leave_no_blank_line_in_piped_output(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    logs = tmp_path / "job"
    logs.mkdir()
    (logs / "rank_0.log").write_text("RuntimeError: CUDA error: an illegal memory access was encountered\n")
    triaged = vigil("logs", "triage", str(logs), "--json", home=tmp_path / "home")
    assert triaged.returncode == 0 and json.loads(triaged.stdout)["root"]["rank"] == 0
    assert triaged.stderr == ""
    missing = vigil("logs", "parse", str(tmp_path / "none.log"), home=tmp_path / "home")
    assert missing.returncode == 2 and missing.stderr.startswith("error: cannot read log file")
    usage = vigil("du", str(logs), home=tmp_path / "home")
    assert usage.returncode == 0 and usage.stdout.splitlines()[0].strip() != "", usage.stdout


# ----------------------------------------------------------------------------- access by role


@pytest.fixture
def team(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A server with four users, one per role, and the users file they were added to."""
    from fastapi.testclient import TestClient

    from vigil.config import Settings
    from vigil.faces.api.app import create_app
    from vigil.faces.api.auth import User, hash_token, save_users
    from vigil.remedy.actuators.base import OutboxActuator
    from vigil.remedy.audit import AuditLog
    from vigil.remedy.remediator import Remediator
    from vigil.store.sql import Store

    tokens = {name: f"tok-{name}-{'x' * 20}" for name in ("vera", "otto", "ada", "alan", "root")}
    roles = {"vera": "viewer", "otto": "operator", "ada": "approver", "alan": "approver", "root": "admin"}
    users_file = tmp_path / "users.yaml"
    save_users(users_file, [User(name=n, role=roles[n], token_sha256=hash_token(t)) for n, t in tokens.items()])
    store = Store(f"sqlite:///{tmp_path / 'vigil.db'}")
    settings = Settings(home=tmp_path, users_file=users_file)
    # a back end with execution off: executing an approved action is a dry run
    remediator = Remediator([OutboxActuator(tmp_path / "outbox.jsonl")], AuditLog(store.url), hold_dry_runs=False)
    with TestClient(create_app(store, settings=settings, remediator=remediator)) as client:
        yield client, tokens, users_file


def _as(tokens: dict[str, str], name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tokens[name]}"}


def test_tokens_are_stored_hashed_and_reads_need_one(team) -> None:  # type: ignore[no-untyped-def]
    client, tokens, users_file = team
    stored = users_file.read_text()
    assert all(token not in stored for token in tokens.values())
    assert client.get("/api/v1/incidents").status_code == 401
    assert client.get("/api/v1/incidents", headers={"Authorization": "Bearer forged"}).status_code == 401
    assert client.get("/api/v1/incidents", headers=_as(tokens, "vera")).status_code == 200


def test_roles_and_the_two_person_rule(team) -> None:  # type: ignore[no-untyped-def]
    client, tokens, _ = team
    cordon = {"kind": "cordon", "target": "node/n1", "reason": "Xid 79"}
    viewer = client.post("/api/v1/actions", json=cordon, headers=_as(tokens, "vera"))
    assert viewer.status_code == 403 and "viewer" in viewer.json()["detail"]
    proposed = client.post("/api/v1/actions", json=cordon, headers=_as(tokens, "ada"))
    assert proposed.status_code == 201 and proposed.json()["requested_by"] == "ada"
    action_id = proposed.json()["id"]
    operator = client.post(f"/api/v1/actions/{action_id}/approve", headers=_as(tokens, "otto"))
    assert operator.status_code == 403
    own = client.post(f"/api/v1/actions/{action_id}/approve", headers=_as(tokens, "ada"))
    assert own.status_code == 403 and "two-person rule" in own.json()["detail"]
    other = client.post(f"/api/v1/actions/{action_id}/approve", headers=_as(tokens, "alan"))
    assert other.status_code == 200 and other.json()["params"]["approved_by"] == "alan"
    done = client.post(f"/api/v1/actions/{action_id}/execute", headers=_as(tokens, "otto"))
    assert done.status_code == 200 and done.json()["params"]["dry_run_by"] == "otto"
    # An alert takes nothing away: its proposer may approve it.
    alert = client.post("/api/v1/actions", json={**cordon, "kind": "alert"}, headers=_as(tokens, "root")).json()
    assert client.post(f"/api/v1/actions/{alert['id']}/approve", headers=_as(tokens, "root")).status_code == 200


def test_self_declared_identity_headers_are_ignored(team) -> None:  # type: ignore[no-untyped-def]
    client, tokens, _ = team
    headers = {**_as(tokens, "ada"), "X-Vigil-User": "alan"}
    proposed = client.post("/api/v1/actions", json={"kind": "drain", "target": "node/n2"}, headers=headers)
    assert proposed.json()["requested_by"] == "ada"


def test_users_cli_prints_the_token_once_and_stores_its_hash(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    from vigil.faces.api.auth import hash_token, load_users

    users_file = tmp_path / "users.yaml"
    added = vigil("users", "add", "ada", "--role", "approver", "--file", str(users_file), home=tmp_path)
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()
    assert load_users(users_file)[0].token_sha256 == hash_token(token) and token not in users_file.read_text()
    one_line_error(vigil("users", "add", "ada", "--role", "viewer", "--file", str(users_file), home=tmp_path),
                   "already exists")
    one_line_error(vigil("users", "add", "bob", "--role", "root", "--file", str(users_file), home=tmp_path), "role")


def _stored_cluster(home: Path) -> None:
    from vigil.model import Gpu, Incident, Node, Topology
    from vigil.store.sql import Store

    store = Store(f"sqlite:///{home / 'vigil.db'}")
    store.save_topology(Topology(cluster="t", nodes=[
        Node(name=f"n{i}", switch="s0", gpus=[Gpu(node=f"n{i}", index=g) for g in range(2)]) for i in range(1, 4)]))
    store.upsert_incident(Incident(
        id="inc-0123456789abcdef0123456789abcdef", title="double-bit ECC errors rose on GPU 1 " * 4,
        scope="node/n2", entities=["gpu/n2/1"], start=1.0, end=2.0, level=4, fault_types=["gpu_dbe"]))
    store.close()


def test_ids_are_never_cut_in_an_80_column_table(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    _stored_cluster(tmp_path)
    shown = vigil("incidents", home=tmp_path, env={"COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    assert "inc-0123456789abcdef0123456789abcdef" in shown.stdout
    assert max(len(line) for line in shown.stdout.splitlines()) <= 80


def test_nodes_unhealthy_and_the_summary_line(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    _stored_cluster(tmp_path)
    sick = json.loads(vigil("nodes", "--unhealthy", "--json", home=tmp_path).stdout)
    assert [row["node"] for row in sick] == ["node/n2"]
    shown = vigil("nodes", home=tmp_path)
    assert "3 nodes: 2 healthy, 1 with a fault or out of service" in shown.stdout


# ----------------------------------------------------------------------------- markup in data

HOSTILE = ["[bold]loud[/bold]", "[/]", "[red on white]x", "[link=file:///etc/passwd]click[/link]", "[rank0]: x\x1b[2J"]


def test_long_work_shows_progress_on_a_terminal_beside_json(tmp_path: Path) -> None:
    """stdout is the JSON a script reads; the bar goes to stderr, which here is a terminal."""
    import pty

    controller, terminal = pty.openpty()
    env = {**os.environ, "VIGIL_HOME": str(tmp_path / "home"), "COLUMNS": "100"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    shown = b""
    with subprocess.Popen([*VIGIL, "sim", "--out", str(tmp_path / "run"), "--nodes", "2", "--minutes", "30",
                           "--json"], stdout=subprocess.PIPE, stderr=terminal, env=env) as done:
        os.close(terminal)
        try:
            while True:  # drain the terminal as the bar is drawn, so the child never blocks on a full one
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # the child closed its end: everything is read
                    break
                if not chunk:
                    break
                shown += chunk
        finally:
            os.close(controller)
        stdout = done.stdout.read() if done.stdout is not None else b""
    assert done.returncode == 0
    assert json.loads(stdout)["out"] == str(tmp_path / "run")
    assert b"writing" in shown, shown[-500:]


def test_stacks_of_a_run_without_sweeps_says_why_the_table_is_empty(tmp_path: Path,
                                                                  vigil: Callable[..., Ran]) -> None:
    (tmp_path / "run").mkdir()
    shown = vigil("stacks", str(tmp_path / "run"), home=tmp_path / "home")
    assert shown.returncode == 0, shown.stderr
    assert "no stack sweeps recorded" in " ".join(shown.stdout.split()), shown.stdout


def test_triage_tables_fold_long_entity_ids_at_80_columns(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    logs = tmp_path / "pretrain-llama-70b-node-failure-during-allgather-restart-3"
    logs.mkdir()
    (logs / "job.log").write_text(
        "[rank1]:[E ProcessGroupNCCL.cpp:537] Some NCCL operations have failed or timed out.\n"
        "[rank1]:[E ProcessGroupNCCL.cpp:543] To avoid data inconsistency, we are taking the entire process down.\n")
    shown = vigil("logs", "triage", str(logs), home=tmp_path / "home", env={"COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    assert "\u2026" not in shown.stdout
    lines = shown.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("│ entity"))
    last = next(i for i, line in enumerate(lines) if line.startswith("│ fault"))
    entity = "".join(line.split("│")[2].strip() for line in lines[first:last])
    assert entity == f"job/{logs.name}/rank/1", shown.stdout


def test_data_table_shows_markup_in_data_as_written() -> None:
    from io import StringIO

    from vigil.faces.cli.output import DataTable, styled

    table = DataTable("name", "level", title="under [/]", caption="[bold]caption")
    for name in HOSTILE:
        table.add_row(name, styled("drain", "red"))
    buffer = StringIO()
    SafeConsole(file=buffer, force_terminal=True, color_system="standard", width=200).print(table)
    text = buffer.getvalue()
    for name in ("[bold]loud[/bold]", "[/]", "[red on white]x", "[link=file:///etc/passwd]click[/link]"):
        assert name in text
    assert "under [/]" in text and "[bold]caption" in text
    assert "\x1b]8;" not in text  # no hyperlink escape from "[link=...]"
    assert "\\x1b[2J" in text and "\x1b[2J" not in text
    assert "\x1b[31m" in text  # the styled cell keeps its colour


def test_hostile_titles_and_file_names_never_break_or_restyle_a_table(
    tmp_path: Path, vigil: Callable[..., Ran]
) -> None:
    from vigil.model import Incident
    from vigil.store.sql import Store

    _stored_cluster(tmp_path)
    store = Store(f"sqlite:///{tmp_path / 'vigil.db'}")
    for n, title in enumerate(HOSTILE):
        store.upsert_incident(Incident(id=f"inc-hostile-{n}", title=title, scope="node/n1", entities=["node/n1"],
                                       start=3.0, end=4.0, level=2, fault_types=["gpu_xid"]))
    store.close()
    shown = vigil("incidents", home=tmp_path)
    assert shown.returncode == 0, shown.stderr
    for title in HOSTILE[:4]:
        assert title in shown.stdout
    assert "[rank0]: x\\x1b[2J" in shown.stdout and "\x1b" not in shown.stdout

    tree = tmp_path / "tree"
    for name in ("[bold]", "[/]", "[red]x[/red]"):
        (tree / name).mkdir(parents=True)
        (tree / name / "f").write_bytes(b"x" * 5000)
    listed = vigil("du", str(tree), home=tmp_path)
    assert listed.returncode == 0, listed.stderr
    for name in ("[bold]", "[/]", "[red]x[/red]"):
        assert name in listed.stdout
    assert str(tree) in listed.stdout


def test_demo_summary_never_cuts_ids_at_80_columns(tmp_path: Path, vigil: Callable[..., Ran]) -> None:
    shown = vigil("demo", "--minutes", "60", "--nodes", "16", home=tmp_path, env={"COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    assert max(len(line) for line in shown.stdout.splitlines()) <= 80
    incidents = json.loads(vigil("incidents", "--json", home=tmp_path).stdout)
    assert incidents
    for incident in incidents:
        assert incident["id"] in shown.stdout
    # The ground-truth table: every entity id whole, never "nic/n001/mlx…".
    rows = [line.split("│") for line in shown.stdout.splitlines() if line.count("│") == 7]
    entities = [cells[2].strip() for cells in rows if "/" in cells[2]]
    assert entities and not any("…" in e for e in entities)
