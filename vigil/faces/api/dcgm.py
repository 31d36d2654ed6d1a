"""A simulated dcgm-exporter: the simulator's ``gpu`` frames in Prometheus text format.

The metric names are the DCGM field names the simulator already uses (``DCGM_FI_DEV_GPU_TEMP`` ...) and the
labels are the ones dcgm-exporter renders (internal/pkg/rendermetrics/render_metrics.go): ``gpu``, ``UUID``,
``pci_bus_id``, ``device``, ``modelName``, ``Hostname``. A real Prometheus scrapes this endpoint exactly as
it would scrape ``:9400/metrics`` of a dcgm-exporter pod, so everything downstream (PromQL reads, rules) is
exercised against the real wire format.
"""

from __future__ import annotations

import math

from vigil.knowledge.metrics import metric_catalogue
from vigil.model import Gpu, Topology, parse_entity
from vigil.store.metrics import MetricFrame

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def escape_label(value: str) -> str:
    """Label values escape backslash, double quote and newline (text exposition format)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _gpu_labels(entity: str, gpus: dict[str, Gpu]) -> str:
    _, (node, index) = parse_entity(entity)
    gpu = gpus.get(entity)
    labels = {
        "gpu": index,
        "UUID": (gpu.uuid if gpu and gpu.uuid else f"GPU-{node}-{index}"),
        "pci_bus_id": gpu.pci_bus_id if gpu else "",
        "device": f"nvidia{index}",
        "modelName": gpu.model if gpu else "",
        "Hostname": node,
    }
    return ",".join(f'{key}="{escape_label(value)}"' for key, value in labels.items())


def render_dcgm(frame: MetricFrame, topology: Topology | None = None) -> str:
    """One scrape of every GPU in ``frame`` as dcgm-exporter would print it; NaN values (a GPU that fell
    off the bus) are left out, as dcgm-exporter leaves out fields it cannot read."""
    gpus: dict[str, Gpu] = {}
    if topology is not None:
        gpus = {g.id: g for node in topology.nodes for g in node.gpus}
    gpu_rows = [(i, e) for i, e in enumerate(frame.entities) if e.startswith("gpu/")]
    label_cache = {e: _gpu_labels(e, gpus) for _, e in gpu_rows}
    lines: list[str] = []
    for j, metric in enumerate(frame.metrics):
        if not metric.startswith("DCGM_"):
            continue
        spec = metric_catalogue().get(metric)
        kind = spec.type if spec is not None else "gauge"
        help_text = spec.help if spec is not None else metric.removeprefix("DCGM_FI_").replace("_", " ").lower()
        lines.append(f"# HELP {metric} {help_text}.")
        lines.append(f"# TYPE {metric} {kind}")
        for i, entity in gpu_rows:
            value = float(frame.values[i, j])
            if math.isnan(value):
                continue
            lines.append(f"{metric}{{{label_cache[entity]}}} {_format_value(value)}")
    return "\n".join(lines) + "\n"


def _format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)
