"""A metrics source that reads a Prometheus-compatible HTTP API (Prometheus, VictoriaMetrics, Thanos).

Vigil runs on an existing monitoring stack this way: the same ``series(entity, metric, start, end)`` call the
embedded MetricStore answers is translated into PromQL over the labels dcgm-exporter and Vigil's own
exporter use, and sent to ``/api/v1/query_range``. Errors come back as one line naming the query.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from vigil.model import VigilInputError, gpu_id, job_id, nic_id, node_id, parse_entity, rank_id
from vigil.store.metrics import MetricFrame

# The labels that name an entity (see ``labels_entity``).
ENTITY_LABELS = ("node", "Hostname", "gpu", "nic", "job_id", "rank")
_METRIC_NAME = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*$")
_ENTITY_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$")


@dataclass
class PromSeries:
    """One series of a query result: its labels and (ts, value) points."""

    labels: dict[str, str]
    ts: np.ndarray
    values: np.ndarray = field(repr=False)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def entity_selector(entity: str) -> dict[str, str]:
    """Label matchers that pick one entity's series: dcgm-exporter's ``Hostname``/``gpu`` for GPUs,
    Vigil's exporter's ``node``/``job``/``rank`` labels otherwise."""
    kind, parts = parse_entity(entity)
    if kind == "gpu":
        return {"Hostname": parts[0], "gpu": parts[1]}
    if kind == "node":
        return {"node": parts[0]}
    if kind == "nic":
        return {"node": parts[0], "nic": parts[1]}
    if kind == "job":
        return {"job_id": parts[0]}
    if kind == "rank":
        return {"job_id": parts[0], "rank": parts[1]}
    raise VigilInputError(f"entity {entity!r}: no Prometheus label mapping for {kind} entities")


def labels_entity(labels: dict[str, str]) -> str | None:
    """The entity a series' labels name (the inverse of ``entity_selector``), or None."""
    job, rank = labels.get("job_id", ""), labels.get("rank", "")
    if job and _ENTITY_PART.match(job):
        return rank_id(job, int(rank)) if rank.isdigit() else job_id(job)
    host = labels.get("node") or labels.get("Hostname")
    if not host or not _ENTITY_PART.match(host):
        return None
    gpu, nic = labels.get("gpu", ""), labels.get("nic", "")
    if gpu.isdigit():
        return gpu_id(host, int(gpu))
    if nic and _ENTITY_PART.match(nic):
        return nic_id(host, nic)
    return node_id(host)


def selector(metric: str, labels: dict[str, str]) -> str:
    inner = ",".join(f"{key}={_quote(value)}" for key, value in labels.items())
    return f"{metric}{{{inner}}}"


class PromQLSource:
    """Queries a Prometheus-compatible API at ``base_url`` (e.g. http://prometheus:9090)."""

    def __init__(self, base_url: str, timeout_s: float = 10.0, token: str = "") -> None:
        if not base_url.startswith(("http://", "https://")):
            raise VigilInputError(f"metrics URL {base_url!r}: expected http://host:port or https://host:port")
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers)

    def close(self) -> None:
        self._client.close()

    def _get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        try:
            response = self._client.get(path, params=params)
        except httpx.HTTPError as err:
            raise VigilInputError(f"cannot reach the metrics API at {self.base_url}: {err}") from None
        try:
            body = response.json()
        except ValueError:
            raise VigilInputError(
                f"metrics API {self.base_url}{path} answered HTTP {response.status_code} with a non-JSON body"
            ) from None
        if body.get("status") != "success":
            raise VigilInputError(
                f"metrics API rejected query {params.get('query', '')!r}: "
                f"{body.get('errorType', 'error')}: {body.get('error', 'unknown error')}"
            )
        data: dict[str, Any] = body["data"]
        return data

    def ready(self) -> bool:
        try:
            return self._client.get("/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def query(self, expr: str, at: float | None = None) -> list[PromSeries]:
        """An instant query: one point per series."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        if data["resultType"] == "scalar":
            ts, value = data["result"]
            return [PromSeries({}, np.array([float(ts)]), np.array([float(value)]))]
        if data["resultType"] != "vector":
            raise VigilInputError(f"query {expr!r} returned a {data['resultType']}; expected an instant vector")
        return [
            PromSeries(item["metric"], np.array([float(item["value"][0])]), np.array([float(item["value"][1])]))
            for item in data["result"]
        ]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[PromSeries]:
        if end < start:
            raise VigilInputError(f"query range: end {end} is before start {start}")
        if step <= 0 or (end - start) / step > 11000:
            raise VigilInputError("query range: step must be > 0 and give at most 11000 points per series")
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        data = self._get("/api/v1/query_range", params)
        result = []
        for item in data["result"]:
            points = item["values"]
            result.append(
                PromSeries(
                    item["metric"],
                    np.array([float(p[0]) for p in points]),
                    np.array([float(p[1]) for p in points]),
                )
            )
        return result

    def series(
        self,
        entity: str,
        metric: str,
        start: float | None = None,
        end: float | None = None,
        step: float = 15.0,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The same call MetricStore answers: one entity's metric over [start, end] (default: last hour)."""
        end = time.time() if end is None else end
        start = end - 3600.0 if start is None else start
        found = self.query_range(selector(metric, entity_selector(entity)), start, end, step)
        if not found:
            return np.empty(0), np.empty(0)
        # Several scrape targets can expose the same entity (e.g. two exporters); take the first.
        first = found[0]
        keep = ~np.isnan(first.values) if len(first.values) else np.ones(0, dtype=bool)
        return first.ts[keep], first.values[keep]

    def gpu_frame(
        self, metrics: Sequence[str], entities: Sequence[str] | None = None, at: float | None = None
    ) -> MetricFrame:
        """One ``gpu`` MetricFrame (what the detectors read) from dcgm-exporter series in Prometheus: one
        instant query for all the metrics, rows keyed by the ``Hostname`` and ``gpu`` labels. With
        ``entities`` the rows keep that order (a GPU that reports nothing is a row of NaN, as in the
        simulator); without, every GPU found, sorted."""
        for metric in metrics:
            if not _METRIC_NAME.match(metric):
                raise VigilInputError(f"metric name {metric!r}: expected [A-Za-z_:][A-Za-z0-9_:]*")
        found = self.query("{__name__=~" + _quote("|".join(metrics)) + "}", at=at)
        values: dict[str, dict[str, float]] = {}
        stamp = at
        for series in found:
            host, index = series.labels.get("Hostname"), series.labels.get("gpu", "")
            if not host or not index.isdigit():
                continue
            values.setdefault(gpu_id(host, int(index)), {})[series.labels["__name__"]] = float(series.values[0])
            stamp = float(series.ts[0]) if stamp is None else stamp
        rows = list(entities) if entities is not None else sorted(values)
        matrix = np.full((len(rows), len(metrics)), np.nan, dtype=np.float32)
        for i, entity in enumerate(rows):
            for j, metric in enumerate(metrics):
                matrix[i, j] = values.get(entity, {}).get(metric, np.nan)
        return MetricFrame(
            ts=stamp if stamp is not None else time.time(),
            family="gpu",
            entities=rows,
            metrics=list(metrics),
            values=matrix,
        )

    def samples(self, metrics: Sequence[str], at: float | None = None) -> list[tuple[str, str, float, float]]:
        """The latest value of every series of ``metrics`` as (metric, entity, value, ts): one instant query
        per scrape interval, rows named by the labels Vigil's node agent exposes (``node`` with ``gpu`` or
        ``nic``) or, scraped straight from dcgm-exporter, its ``Hostname`` and ``gpu``. Series naming no
        entity are left out.

        Prometheus keeps only the labels that name an entity (``max by``): a dcgm-exporter series carries
        eight more (UUID, PCI bus id, model, driver ...) that would triple the answer at 10,000 GPUs."""
        for metric in metrics:
            if not _METRIC_NAME.match(metric):
                raise VigilInputError(f"metric name {metric!r}: expected [A-Za-z_:][A-Za-z0-9_:]*")
        expr = f"max by (__name__, {', '.join(ENTITY_LABELS)}) ({{__name__=~{_quote('|'.join(metrics))}}})"
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        if data["resultType"] != "vector":
            raise VigilInputError(f"query {expr!r} returned a {data['resultType']}; expected an instant vector")
        out = []
        names: dict[tuple[str, ...], str | None] = {}  # the same few label sets name every metric of an entity
        for item in data["result"]:
            labels = item["metric"]
            key = tuple(labels.get(label, "") for label in ENTITY_LABELS)
            if key not in names:
                names[key] = labels_entity(labels)
            entity = names[key]
            ts, value = item["value"]
            number = float(value)
            if entity is not None and not math.isnan(number):
                out.append((labels["__name__"], entity, number, float(ts)))
        return out

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ready():
                return
            time.sleep(0.1)
        raise VigilInputError(f"metrics API at {self.base_url} not ready after {timeout_s:g} s")
