"""The simulated dcgm-exporter renders valid Prometheus text with dcgm-exporter's names and labels."""

from __future__ import annotations

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from vigil.faces.api.dcgm import escape_label, render_dcgm
from vigil.sources.sim import SimConfig, simulate


def test_rendered_gpu_frame_parses_with_dcgm_labels() -> None:
    run = simulate(SimConfig(nodes=2, gpus=4, minutes=1, seed=3))
    tick = next(iter(run.ticks()))
    frame = next(f for f in tick.frames if f.family == "gpu")
    values = frame.values.copy()
    values[1, :] = np.nan  # GPU fell off the bus: no fields at all
    frame = type(frame)(ts=frame.ts, family="gpu", entities=frame.entities, metrics=frame.metrics, values=values)
    text = render_dcgm(frame, run.topology)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    temp = families["DCGM_FI_DEV_GPU_TEMP"]
    assert temp.type == "gauge"
    assert len(temp.samples) == 2 * 4 - 1
    sample = temp.samples[0]
    gpu = run.topology.node(sample.labels["Hostname"]).gpus[int(sample.labels["gpu"])]
    assert sample.labels["UUID"] == gpu.uuid
    assert sample.labels["pci_bus_id"] == gpu.pci_bus_id
    assert sample.labels["modelName"] == gpu.model
    assert sample.labels["device"] == f"nvidia{sample.labels['gpu']}"
    j = list(frame.metrics).index("DCGM_FI_DEV_GPU_TEMP")
    assert sample.value == float(frame.values[0, j])
    # counters keep dcgm-exporter's names (no _total added) and are typed as counters
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in text


def test_label_values_are_escaped() -> None:
    assert escape_label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
