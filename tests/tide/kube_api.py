"""A local API server that answers from stored objects (tests/fixtures/tide/kube, in the real API's shapes):
GET of an object or a collection (with ``labelSelector`` k=v), POST creates (409 AlreadyExists when it
exists), PATCH applies a JSON merge patch (RFC 7386), DELETE removes an object. Every request is logged for the
tests to assert on."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tide" / "kube"
PLURALS = {"ClusterQueue": "clusterqueues", "LocalQueue": "localqueues", "ResourceFlavor": "resourceflavors",
           "Workload": "workloads", "Job": "jobs", "Pod": "pods", "PriorityClass": "priorityclasses",
           "PyTorchJob": "pytorchjobs", "JobSet": "jobsets", "TFJob": "tfjobs", "MPIJob": "mpijobs"}


def object_path(obj: dict[str, Any]) -> str:
    version = obj["apiVersion"]
    prefix = "/api/v1" if version == "v1" else f"/apis/{version}"
    namespace = obj["metadata"].get("namespace")
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"{prefix}{where}/{PLURALS[obj['kind']]}/{obj['metadata']['name']}"


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _status(code: int, reason: str, message: str = "") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class RecordedApi:
    def __init__(self, *fixtures: str) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        for name in fixtures:
            for obj in json.loads((FIXTURES / name).read_text()):
                self.objects[object_path(obj)] = obj
        self.requests: list[tuple[str, str, Any]] = []

    def add(self, objects: list[dict[str, Any]]) -> None:
        """More objects, e.g. from another fixture directory."""
        for obj in objects:
            self.objects[object_path(obj)] = obj

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        self.requests.append((method, path, body))
        url = urlparse(path)
        route = unquote(url.path)
        if method == "GET" and route in self.objects:
            return 200, self.objects[route]
        if method == "PATCH":
            if route not in self.objects:
                return 404, _status(404, "NotFound", f"{route} not found")
            self.objects[route] = merge_patch(self.objects[route], body)
            return 200, self.objects[route]
        if method == "POST":
            created = dict(body, metadata=dict(body["metadata"]))
            if "/namespaces/" in route:
                created["metadata"]["namespace"] = route.split("/namespaces/")[1].split("/")[0]
            key = object_path(created)
            if key in self.objects:
                return 409, _status(409, "AlreadyExists", f"{created['kind']} {created['metadata']['name']} exists")
            self.objects[key] = created
            return 201, created
        if method == "GET":
            return self._list(route, parse_qs(url.query).get("labelSelector", [""])[0])
        if method == "DELETE" and route in self.objects:
            return 200, self.objects.pop(route)
        return 404, _status(404, "NotFound")

    def _list(self, route: str, selector: str) -> tuple[int, Any]:
        plural = route.rsplit("/", 1)[-1]
        if plural not in PLURALS.values():
            return 404, _status(404, "NotFound")
        # a cluster-wide list of a namespaced kind: /apis/<group>/<version>/<plural>
        cluster_wide = "/namespaces/" not in route
        wanted = dict(term.split("=", 1) for term in selector.split(",") if "=" in term)
        items = [
            obj for key, obj in self.objects.items()
            if (key.startswith(route + "/") or (cluster_wide and key.rsplit("/", 2)[-2] == plural
                                               and key.startswith(route.rsplit("/", 1)[0])))
            and all(obj["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
        ]
        return 200, {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "52000"}, "items": items}
