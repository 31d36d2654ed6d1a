"""The shipped DaemonSet and systemd unit stay in step with the agent's settings and command line."""

from __future__ import annotations

import configparser
import json
from pathlib import Path

import yaml

from vigil.sources.collect.agent import AgentSettings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SETTINGS = {f"VIGIL_AGENT_{name.upper()}" for name in AgentSettings.model_fields}


def test_daemonset_env_names_are_agent_settings_and_mounts_match_sources() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "agent-daemonset.yaml").read_text()))
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["vigil", "agent"]
    vigil_env = {e["name"] for e in container["env"] if e["name"].startswith("VIGIL_")}
    assert vigil_env and vigil_env <= SETTINGS, vigil_env - SETTINGS
    assert any(e["name"] == "NODE_NAME" for e in container["env"])
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/dev/kmsg", "/sys/class/infiniband"} <= mounts
    # the shipped rank-log layout is valid, reads the mounted pod logs and names a PyTorchJob pod's job
    [layouts] = [e["value"] for e in container["env"] if e["name"] == "VIGIL_AGENT_RANK_LOGS"]
    [layout] = AgentSettings.model_validate({"rank_logs": json.loads(layouts)}).rank_logs
    assert layout.glob.startswith("/var/log/pods/") and "/var/log/pods" in mounts
    assert layout.owner_of("/var/log/pods/team-a_llm-pretrain-worker-3_0f3c9a1e-77/pytorch/0.log") == (
        "llm-pretrain", None)
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    verbs = {(r["resources"][0], v) for r in role["rules"] for v in r["verbs"]}
    assert verbs == {("nodes", "get"), ("events", "list")}  # read-only: what KubernetesSource calls


def test_systemd_unit_runs_the_agent_with_known_settings() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((DEPLOY / "systemd" / "vigil-agent.service").read_text())
    assert unit["Service"]["ExecStart"].split()[1:3] == ["agent", "--port"]
    envs = [v.split("=", 1)[0] for v in unit["Service"]["Environment"].splitlines() if v.startswith("VIGIL_")]
    assert set(envs) <= SETTINGS
    assert unit["Install"]["WantedBy"] == "multi-user.target"
