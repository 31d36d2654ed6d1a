"""A small local HTTP server that implements the few Kubernetes API endpoints the actuator uses.

No API server runs in CI; this one keeps nodes, pods, PodDisruptionBudget-protected pods and
RebootNode custom resources in memory, applies strategic-merge patches the way the API server does
for the fields touched (labels merge, ``spec.taints`` replace, ``status.conditions`` merge by type),
lists a namespace's pods by label (``labelSelector`` k=v), deletes pods, and logs every request so
tests can assert on the calls.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest


class FakeKube:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.pdb_protected: set[tuple[str, str]] = set()
        self.reboots: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()

    def add_node(self, name: str) -> None:
        self.nodes[name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
        }

    def add_pod(self, namespace: str, name: str, node: str, owner_kind: str | None = None) -> None:
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if owner_kind:
            metadata["ownerReferences"] = [
                {"apiVersion": "apps/v1", "kind": owner_kind, "name": f"{name}-owner", "uid": "u1"}
            ]
        self.pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": metadata,
                "spec": {"nodeName": node, "containers": [{"name": "main", "image": "trainer:1"}]},
            }
        )

    def add_pod_object(self, pod: dict[str, Any]) -> None:
        """A pod as the API server returns it (e.g. from tests/fixtures/remedy/kube)."""
        self.pods.append(pod)

    # ------------------------------------------------------------------ request handling

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        with self.lock:
            self.requests.append((method, path, body))
            url = urlparse(path)
            route = url.path
            if match := re.fullmatch(r"/api/v1/nodes/([^/]+)(/status)?", route):
                name, status = match.group(1), match.group(2)
                node = self.nodes.get(name)
                if node is None:
                    return 404, _status(404, "NotFound")
                if method == "PATCH":
                    _merge_node(node, body, status_only=bool(status))
                return 200, node
            if route == "/api/v1/pods" and method == "GET":
                selector = parse_qs(url.query).get("fieldSelector", [""])[0]
                wanted = selector.removeprefix("spec.nodeName=")
                items = [p for p in self.pods if p["spec"]["nodeName"] == wanted]
                return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
            if (match := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", route)) and method == "GET":
                selector = parse_qs(url.query).get("labelSelector", [""])[0]
                wanted = dict(term.split("=", 1) for term in selector.split(",") if "=" in term)
                items = [p for p in self.pods if p["metadata"]["namespace"] == match.group(1)
                         and all(p["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())]
                return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
            if (match := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)", route)) and method == "DELETE":
                key = (match.group(1), match.group(2))
                found = [p for p in self.pods if (p["metadata"]["namespace"], p["metadata"]["name"]) == key]
                if not found:
                    return 404, _status(404, "NotFound")
                self.pods.remove(found[0])
                return 200, found[0]
            if match := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction", route):
                key = (match.group(1), match.group(2))
                if key in self.pdb_protected:
                    return 429, _status(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                    )
                self.pods = [p for p in self.pods if (p["metadata"]["namespace"], p["metadata"]["name"]) != key]
                return 201, _status(201, "Success")
            if match := re.fullmatch(r"/apis/janitor.dgxc.nvidia.com/v1alpha1/rebootnodes(?:/([^/]+))?", route):
                name = match.group(1)
                if method == "GET" and name:
                    return (200, self.reboots[name]) if name in self.reboots else (404, _status(404, "NotFound"))
                if method == "POST":
                    cr_name = body["metadata"]["name"]
                    if cr_name in self.reboots:
                        return 409, _status(409, "AlreadyExists")
                    self.reboots[cr_name] = body
                    return 201, body
            return 404, _status(404, "NotFound")


def _status(code: int, reason: str, message: str = "") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "code": code, "reason": reason, "message": message}


def _merge_node(node: dict[str, Any], patch: dict[str, Any], status_only: bool) -> None:
    if status_only:
        conditions = node["status"].setdefault("conditions", [])
        for new in patch.get("status", {}).get("conditions", []):
            conditions[:] = [c for c in conditions if c["type"] != new["type"]] + [new]
        return
    labels = patch.get("metadata", {}).get("labels", {})
    node["metadata"].setdefault("labels", {}).update(labels)
    node["spec"].update(patch.get("spec", {}))


@contextmanager
def serve(kube: FakeKube) -> Iterator[str]:
    """Run the fake API server on a free loopback port; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            code, payload = kube.handle(method, self.path, body)
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self._reply("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._reply("POST")

        def do_PATCH(self) -> None:  # noqa: N802
            self._reply("PATCH")

        def do_DELETE(self) -> None:  # noqa: N802
            self._reply("DELETE")

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence request logs
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def use_kubeconfig(path: Path, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the kubernetes client at the API server at ``url`` through a kubeconfig written at ``path`` (the
    client reads $KUBECONFIG once, when it is imported, so its default location is patched instead)."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": url}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "users": [{"name": "test", "user": {}}]}))
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
