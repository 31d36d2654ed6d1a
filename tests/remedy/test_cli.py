from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.remedy.kube_server import FakeKube, serve, use_kubeconfig
from vigil.config import settings
from vigil.faces.cli.remedy import _backends_for, app
from vigil.knowledge.actions import action_whitelist
from vigil.model import Action, ActionKind, Anomaly, FaultLevel, Node, Topology
from vigil.remedy.actuators.base import OutboxActuator


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("VIGIL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VIGIL_DB_URL", f"sqlite:///{tmp_path}/vigil.db")
    settings.cache_clear()
    yield tmp_path
    settings.cache_clear()


def write_inputs(root: Path) -> tuple[Path, Path]:
    anomalies = root / "anomalies.jsonl"
    anomalies.write_text(
        "\n".join(
            Anomaly(
                entity=f"gpu/n{i}/0", start=0, end=0, detector="t", fault_type="xid_79", level=FaultLevel.ISOLATE
            ).to_json()
            for i in range(4)
        )
    )
    topology = root / "topology.json"
    topology.write_text(Topology(nodes=[Node(name=f"n{i}", switch=f"s{i % 2}") for i in range(20)]).to_json())
    return anomalies, topology


def test_policies_command() -> None:
    result = CliRunner().invoke(app, ["policies", "--json"])
    assert result.exit_code == 0
    assert [p["name"] for p in json.loads(result.stdout)["policies"]][0] == "job-rank-failure"


def test_apply_dry_run_then_execute_with_guard(home: Path, fake_slurm: Path) -> None:
    anomalies, topology = write_inputs(home)
    runner = CliRunner()
    dry = runner.invoke(app, ["apply", str(anomalies), "--backend", "slurm", "--json"])
    assert dry.exit_code == 0, dry.output
    assert {a["status"] for a in json.loads(dry.stdout) if a["kind"] == "cordon"} == {"proposed"}
    assert not (fake_slurm / "calls.log").exists()

    refused = runner.invoke(app, ["apply", str(anomalies), "--execute"])
    assert refused.exit_code != 0 and "--topology" in str(refused.exception)

    live = runner.invoke(
        app, ["apply", str(anomalies), "--execute", "--topology", str(topology), "--backend", "slurm", "--json"]
    )
    assert live.exit_code == 0, live.output
    cordons = [a for a in json.loads(live.stdout) if a["kind"] == "cordon"]
    # 10% of 20 nodes: two may go out of service; the other two are refused by the guard.
    assert [a["status"] for a in cordons] == ["executed", "executed", "refused", "refused"]
    states = json.loads(runner.invoke(app, ["lifecycle", "--json"]).stdout)
    assert {s["node"]: s["state"] for s in states} == {"node/n0": "draining", "node/n1": "draining"}
    audit = json.loads(runner.invoke(app, ["audit", "--json", "--limit", "1000"]).stdout)
    assert len(audit) == len(json.loads(dry.stdout)) + len(json.loads(live.stdout))


def test_self_check_returns_a_repaired_node(home: Path, fake_slurm: Path) -> None:
    from vigil.remedy.lifecycle import LifecycleStore, Trigger

    store = LifecycleStore()
    store.apply("node/n7", Trigger.CORDON)
    store.apply("node/n7", Trigger.REPAIR)
    result = CliRunner().invoke(app, ["self-check", "node/n7", "--passed"])
    assert result.exit_code == 0 and "healthy" in result.stdout
    assert store.status("node/n7").state.value == "healthy"


def test_bad_anomaly_line_names_the_line(home: Path) -> None:
    bad = home / "bad.jsonl"
    bad.write_text('{"entity": "gpu/n1/0"}\n')
    result = CliRunner().invoke(app, ["apply", str(bad)])
    assert result.exit_code != 0 and "bad.jsonl:1" in str(result.exception)


def test_act_runs_one_plan_step_through_guard_and_audit(home: Path, fake_slurm: Path) -> None:
    _, topology = write_inputs(home)
    runner = CliRunner()
    nowhere = runner.invoke(app, ["act", "cordon", "node/n3", "--json"])
    assert nowhere.exit_code != 0 and "no actuator handles cordon" in str(nowhere.exception)
    dry = runner.invoke(app, ["act", "cordon", "node/n3", "--incident", "inc-1", "--reason", "plan step",
                              "--backend", "slurm", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["status"] == "proposed" and not (fake_slurm / "calls.log").exists()
    live = runner.invoke(app, ["act", "cordon", "node/n3", "--execute", "--topology", str(topology),
                               "--backend", "slurm", "--json"])
    assert live.exit_code == 0, live.output
    assert json.loads(live.stdout)["status"] == "executed"
    assert "nodename=n3" in (fake_slurm / "calls.log").read_text()
    audit = json.loads(runner.invoke(app, ["audit", "--json"]).stdout)
    assert [(a["kind"], a["target"], a["status"]) for a in audit] == [
        ("cordon", "node/n3", "proposed"), ("cordon", "node/n3", "executed")]


def test_a_plan_command_runs_as_printed_with_the_configured_backend(
    home: Path, fake_slurm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command a diagnosis plan prints carries no --backend: `act` takes the configured one, dry-run."""
    command = action_whitelist()[ActionKind.CORDON].command.format(target="node/n3")
    argv = shlex.split(command)
    assert argv[:3] == ["vigil", "remedy", "act"] and "--backend" not in argv
    runner = CliRunner()
    unset = runner.invoke(app, argv[2:])
    assert unset.exit_code != 0
    assert "VIGIL_REMEDY_BACKEND=kubernetes|slurm" in str(unset.exception)
    monkeypatch.setenv("VIGIL_REMEDY_BACKEND", "slurm")
    settings.cache_clear()
    printed = runner.invoke(app, [*argv[2:], "--json"])
    assert printed.exit_code == 0, printed.output
    done = json.loads(printed.stdout)
    assert done["status"] == "proposed" and done["dry_run"] and "scontrol update nodename=n3" in done["result"]
    assert not (fake_slurm / "calls.log").exists()
    # --backend still wins over the setting
    overridden = runner.invoke(app, [*argv[2:], "--backend", "none"])
    assert overridden.exit_code != 0 and "with --backend none" in str(overridden.exception)


def test_act_names_what_carries_out_an_action_nothing_here_can(home: Path) -> None:
    result = CliRunner().invoke(app, ["act", "reset_gpu", "gpu/n3/0", "--backend", "slurm"])
    assert result.exit_code != 0 and "--local-node NODE" in str(result.exception)
    result = CliRunner().invoke(app, ["act", "delete_checkpoint", "job/j7", "--backend", "slurm"])
    assert result.exit_code != 0 and "no scheduler backend" in str(result.exception)
    result = CliRunner().invoke(app, ["act", "migrate_job", "job/j7", "--backend", "none"])
    assert result.exit_code != 0 and "set VIGIL_REMEDY_BACKEND=kubernetes|slurm" in str(result.exception)


def test_node_is_only_for_migrate_job_and_only_a_node(home: Path, fake_slurm: Path) -> None:
    result = CliRunner().invoke(app, ["act", "restart_job", "job/j7", "--node", "node/n3", "--backend", "slurm"])
    assert result.exit_code != 0 and "restart_job does not take it" in str(result.exception)
    result = CliRunner().invoke(app, ["act", "migrate_job", "job/j7", "--node", "gpu/n3/0", "--backend", "slurm"])
    assert result.exit_code != 0 and "expected a node id" in str(result.exception)
    _, topology = write_inputs(home)
    result = CliRunner().invoke(app, ["act", "migrate_job", "job/j7", "--node", "node/x9", "--backend", "slurm",
                                      "--topology", str(topology)])
    assert result.exit_code != 0 and "node/x9 is not in the topology" in str(result.exception)
    assert not (fake_slurm / "calls.log").exists()


def test_a_bad_configured_backend_is_one_line(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIGIL_REMEDY_BACKEND", "pbs")
    settings.cache_clear()
    result = CliRunner().invoke(app, ["act", "cordon", "node/n3"])
    assert result.exit_code != 0 and "remedy_backend" in str(result.exception)


def test_a_bad_backend_flag_names_the_backends_there_are(home: Path) -> None:
    result = CliRunner().invoke(app, ["act", "cordon", "node/n3", "--backend", "pbs"])
    assert result.exit_code != 0
    assert str(result.exception) == "--backend must be none, kubernetes or slurm, got 'pbs'"


def test_act_refuses_what_is_not_whitelisted(home: Path) -> None:
    result = CliRunner().invoke(app, ["act", "rm_rf", "node/n3"])
    assert result.exit_code != 0 and "not on the whitelist" in str(result.exception)
    result = CliRunner().invoke(app, ["act", "cordon", "node/n3; reboot"])
    assert result.exit_code != 0 and "bad entity id" in str(result.exception)


def test_job_actions_on_kubernetes_from_the_command_line(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`act migrate_job` with --backend kubernetes, through a kubeconfig, against the local fake API server."""
    fake = FakeKube()
    for name in ("n1", "n2"):
        fake.add_node(name)
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "remedy" / "kube" / "pytorchjob-pods.json"
    for pod in json.loads(fixtures.read_text()):
        fake.add_pod_object(pod)
    _, topology = write_inputs(home)
    runner = CliRunner()
    with serve(fake) as url:
        use_kubeconfig(home / "kubeconfig", url, monkeypatch)
        typo = runner.invoke(app, ["act", "restart_job", "job/4242", "--backend", "kubernetes"])
        assert typo.exit_code != 0 and "job/<namespace>:<name>" in str(typo.exception)
        argv = ["act", "migrate_job", "job/ml-training:llama-ft", "--node", "node/n1", "--backend", "kubernetes",
                "--json"]
        dry = runner.invoke(app, argv)
        assert dry.exit_code == 0, dry.output
        assert json.loads(dry.stdout)["status"] == "proposed" and not any(m == "DELETE" for m, _, _ in fake.requests)
        live = runner.invoke(app, [*argv, "--execute", "--topology", str(topology)])
        assert live.exit_code == 0, live.output
        assert json.loads(live.stdout)["status"] == "executed"
    assert fake.nodes["n1"]["spec"]["unschedulable"] is True and fake.pods == []
    states = json.loads(runner.invoke(app, ["lifecycle", "--json"]).stdout)
    assert [(s["node"], s["state"]) for s in states] == [("node/n1", "cordoned")]


def test_the_backend_table_in_the_docs_matches_the_actuators() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "remediation.md").read_text()
    table = doc.split("| action | target | none | kubernetes | slurm |\n|---|---|---|---|---|\n", 1)[1].split("\n\n")[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()]
    assert {row[0] for row in rows} == {kind.value for kind in ActionKind}
    example = {"any": "node/n3", "node": "node/n3", "job": "job/ml:llama", "gpu": "gpu/n3/0", "cluster": "cluster/c"}
    for action_name, target, *cells in rows:
        kind = ActionKind(action_name)
        able = _backends_for(Action(ts=0.0, kind=kind, target=example[target]))
        everywhere = kind in OutboxActuator.kinds or kind is ActionKind.RESET_GPU
        for backend, cell in zip(("none", "kubernetes", "slurm"), cells, strict=True):
            assert (cell != "-") == (everywhere or backend in able), (action_name, backend, cell)


def _store_incident(incident_id: str, entities: list[str], root_cause: str | None) -> None:
    from vigil.model import Cause, Diagnosis, Incident
    from vigil.store.sql import open_store

    store = open_store()
    store.upsert_incident(Incident(id=incident_id, title="GPU fell off the bus", scope=entities[0], entities=entities,
                                   start=0.0, end=1.0, level=FaultLevel.ISOLATE, fault_types=["gpu_lost"]))
    if root_cause is not None:
        store.save_diagnosis(Diagnosis(incident_id=incident_id, summary="GPU lost", confidence=0.9,
                                       root_cause=Cause(entity=root_cause, fault_type="gpu_lost", score=0.9)))


def test_migrate_job_takes_the_bad_node_from_the_incident(home: Path, fake_slurm: Path) -> None:
    """--incident: the node of the incident's diagnosed root cause is the bad node; --node still wins."""
    _store_incident("inc-gpu", ["job/j7", "gpu/n3/0", "gpu/n4/1"], root_cause="gpu/n3/0")
    runner = CliRunner()
    done = runner.invoke(app, ["act", "migrate_job", "job/j7", "--incident", "inc-gpu", "--backend", "slurm",
                               "--json"])
    assert done.exit_code == 0, done.output
    action = json.loads(done.stdout)
    assert action["status"] == "proposed" and action["params"]["nodes"] == ["node/n3"]
    assert action["params"]["nodes_from"] == "incident inc-gpu"
    assert "nodename=n3 state=drain" in action["result"] and "n4" not in action["result"]
    named = runner.invoke(app, ["act", "migrate_job", "job/j7", "--incident", "inc-gpu", "--node", "node/n5",
                                "--backend", "slurm", "--json"])
    assert named.exit_code == 0 and json.loads(named.stdout)["params"]["nodes"] == ["node/n5"]
    # no diagnosis: the one node the incident's GPUs live on
    _store_incident("inc-one", ["job/j8", "gpu/n6/0", "gpu/n6/1"], root_cause=None)
    one = runner.invoke(app, ["act", "migrate_job", "job/j8", "--incident", "inc-one", "--backend", "slurm", "--json"])
    assert one.exit_code == 0 and json.loads(one.stdout)["params"]["nodes"] == ["node/n6"]
    # several nodes and nothing diagnosed: no guess; the job's drained nodes decide, as without --incident
    _store_incident("inc-two", ["job/j9", "gpu/n1/0", "gpu/n2/0"], root_cause=None)
    two = runner.invoke(app, ["act", "migrate_job", "job/j9", "--incident", "inc-two", "--backend", "slurm", "--json"])
    assert two.exit_code == 0 and "nodes" not in json.loads(two.stdout)["params"]
    assert "inc-two is not localized to one node (entities on node/n1, node/n2)" in two.stderr
    unknown = runner.invoke(app, ["act", "migrate_job", "job/j7", "--incident", "inc-nope", "--backend", "slurm"])
    assert unknown.exit_code != 0 and "--incident inc-nope: no such incident" in str(unknown.exception)
    assert not (fake_slurm / "calls.log").exists()


def test_act_set_quota_on_slurm_sets_a_qos(home: Path, fake_slurm: Path) -> None:
    """The same options on Slurm: the QOS's GrpTRES (dry-run: the sacctmgr command it would run); a QOS has no
    flavor, and a Kubernetes resource name is not a TRES - each one line, nothing audited."""
    from vigil.remedy.audit import AuditLog

    runner = CliRunner()
    done = runner.invoke(app, ["act", "set_quota", "cluster/hpc", "--queue", "spot-training", "--resource", "gres/gpu",
                               "--quantity", "64", "--backend", "slurm", "--json"])
    assert done.exit_code == 0, done.output
    action = json.loads(done.stdout)
    assert action["status"] == "proposed" and action["params"]["units"] == 64
    assert action["result"] == ("dry-run: would run sacctmgr -i modify qos where name=spot-training set "
                                "GrpTRES=gres/gpu=64")
    flavored = runner.invoke(app, ["act", "set_quota", "cluster/hpc", "--queue", "spot-training", "--quantity", "64",
                                   "--flavor", "h100", "--backend", "slurm"])
    assert flavored.exit_code != 0 and "has no flavors" in str(flavored.exception)
    kube_name = runner.invoke(app, ["act", "set_quota", "cluster/hpc", "--queue", "spot-training", "--quantity",
                                    "64", "--resource", "nvidia.com/gpu", "--backend", "slurm"])
    assert kube_name.exit_code != 0 and "must be cpu, node or gres/<name>" in str(kube_name.exception)
    assert AuditLog().count() == 1


def test_the_audit_table_says_a_retry_succeeded_and_what_it_replaced(home: Path) -> None:
    """The human audit table shows a retry's verdict with the earlier run's failure it replaced, as the JSON holds it
    (the record under the action's id, then its retry's record naming it in params.retry_of)."""
    from vigil.model import ActionStatus
    from vigil.remedy.audit import AuditLog

    audit = AuditLog()
    first = Action(ts=1.0, kind=ActionKind.DRAIN, target="node/n1", reason="xid 79", status=ActionStatus.FAILED,
                   result="slurm: scontrol exited 1: node busy")
    second = Action(ts=2.0, kind=ActionKind.DRAIN, target="node/n1", reason="xid 79", status=ActionStatus.FAILED,
                    result="slurm: scontrol timed out after 30s", params={"retry_of": first.id})
    third = Action(ts=3.0, kind=ActionKind.DRAIN, target="node/n1", reason="xid 79", status=ActionStatus.EXECUTED,
                   result="drained n1", params={"retry_of": first.id})
    for action in (first, second, third):
        audit.record(action)
    table = CliRunner().invoke(app, ["audit"], env={"COLUMNS": "400"})
    assert table.exit_code == 0, table.output
    lines = [line for line in table.stdout.splitlines() if "drain" in line]
    assert "succeeded on retry 2 (earlier: failed: slurm: scontrol exited 1: node busy; failed: slurm: scontrol " \
           "timed out after 30s): drained n1" in lines[2]
    assert "failed on retry 1 (earlier: failed: slurm: scontrol exited 1: node busy)" in lines[1]
    assert "retry" not in lines[0]


def test_act_on_an_incident_shows_the_verdicts_recorded_on_it_before(home: Path, fake_slurm: Path) -> None:
    """`act --incident` shows what was decided on the incident before this action - every audit record of its runs,
    with its verdict - in the table and in --json (``earlier_actions``); another incident's records are not shown, and
    without --incident the JSON is the action alone. Before, only the new action was shown."""
    _, topology = write_inputs(home)
    runner = CliRunner()
    first = runner.invoke(app, ["act", "cordon", "node/n3", "--incident", "inc-9", "--execute", "--topology",
                                str(topology), "--backend", "slurm", "--json"])
    assert first.exit_code == 0, first.output
    done = json.loads(first.stdout)
    assert done["status"] == "executed" and done["earlier_actions"] == []
    other = runner.invoke(app, ["act", "cordon", "node/n5", "--incident", "inc-other", "--backend", "slurm"])
    assert other.exit_code == 0, other.output
    assert "no earlier action recorded on incident inc-other" in other.stdout
    second = runner.invoke(app, ["act", "drain", "node/n3", "--incident", "inc-9", "--backend", "slurm", "--json"])
    assert second.exit_code == 0, second.output
    shown = json.loads(second.stdout)
    assert shown["status"] == "proposed" and shown["kind"] == "drain"
    assert [(a["id"], a["kind"], a["target"], a["status"]) for a in shown["earlier_actions"]] == [
        (done["id"], "cordon", "node/n3", "executed")]
    assert shown["earlier_actions"][0]["verdict"] == done["result"] and done["result"]
    table = runner.invoke(app, ["act", "uncordon", "node/n3", "--incident", "inc-9", "--backend", "slurm"])
    assert table.exit_code == 0, table.output
    assert "Earlier actions on incident inc-9" in table.stdout
    earlier = table.stdout.split("Earlier actions on incident inc-9", 1)[1]
    assert "cordon" in earlier and "executed" in earlier and "drain" in earlier and "proposed" in earlier
    assert "node/n5" not in earlier
    alone = runner.invoke(app, ["act", "cordon", "node/n4", "--backend", "slurm", "--json"])
    assert alone.exit_code == 0 and "earlier_actions" not in json.loads(alone.stdout)
