"""The Kubernetes manifests: valid objects that agree with each other and with the CLI and settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from vigil.config import Settings
from vigil.faces.cli.main import app

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def load(name: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), (name, doc.get("kind"))
        assert doc["metadata"].get("name"), (name, doc["kind"])
    return docs


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def parse_cli(command: list[str]) -> None:
    """Parse (not run) a container command with the real CLI: unknown options or bad values fail."""
    assert command[0] == "vigil"
    root: Any = typer.main.get_command(app)
    sub = root.get_command(root.make_context("vigil", [command[1]]), command[1])
    assert sub is not None, command
    sub.make_context(command[1], list(command[2:]))


def test_server_agent_and_tsdb_agree() -> None:
    server, postgres, tsdb, agent = (
        load(n) for n in ("server.yaml", "postgres.yaml", "victoriametrics.yaml", "agent-daemonset.yaml")
    )
    service = one(server, "Service", "vigil")
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    deployment = one(server, "Deployment", "vigil-server")
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    parse_cli(containers["server"]["command"])
    parse_cli(containers["mcp"]["command"])
    assert containers["mcp"]["ports"][0]["containerPort"] == 8001 and ports["mcp"] == 8001

    agent_env = {
        e["name"]: e
        for c in one(agent, "DaemonSet", "vigil-agent")["spec"]["template"]["spec"]["containers"]
        for e in c.get("env", [])
    }
    assert agent_env["VIGIL_AGENT_SERVER_URL"]["value"] == f"http://vigil.vigil.svc:{ports['http']}"
    token_ref = agent_env["VIGIL_AGENT_SERVER_TOKEN"]["valueFrom"]["secretKeyRef"]
    server_env = {e["name"]: e for e in containers["server"]["env"]}
    assert server_env["VIGIL_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": token_ref["name"],
        "key": token_ref["key"],
    }

    config = one(server, "ConfigMap", "vigil-config")["data"]
    settings = Settings(**{key.removeprefix("VIGIL_").lower(): value for key, value in config.items()})
    assert settings.execute_actions is False  # dry-run until someone decides otherwise
    tsdb_service = one(tsdb, "Service", "victoriametrics")
    assert settings.metrics_url == f"http://victoriametrics.vigil.svc:{tsdb_service['spec']['ports'][0]['port']}"
    pg_service = one(postgres, "Service", "postgres")
    assert f"@postgres.vigil.svc:{pg_service['spec']['ports'][0]['port']}/" in server_env["VIGIL_DB_URL"]["value"]

    scrape = yaml.safe_load(one(tsdb, "ConfigMap", "victoriametrics-scrape")["data"]["scrape.yml"])
    jobs = {j["job_name"]: j for j in scrape["scrape_configs"]}
    assert jobs["vigil"]["static_configs"][0]["targets"] == [f"vigil.vigil.svc:{ports['http']}"]
    assert {"dcgm-exporter", "vigil-agent"} <= set(jobs)
