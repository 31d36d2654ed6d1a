"""Metric families the simulator emits, under the names real exporters use.

GPU metrics carry dcgm-exporter's names (DCGM_FI_*). Host, NIC and job metrics have no single standard
exporter across clusters, so they are Vigil's own families (``vigil_*``, Prometheus naming: units and
``_total`` for counters); the node agent (vigil/sources/collect) exposes the same names from real sources.
"""

from __future__ import annotations

GPU_METRICS: tuple[str, ...] = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_PCIE_LINK_GEN",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)

NODE_METRICS: tuple[str, ...] = (
    "vigil_node_up",
    "vigil_node_cpu_utilization_ratio",
    "vigil_node_memory_used_bytes",
    "vigil_node_load1",
    "vigil_node_fan_speed_min_rpm",
    "vigil_node_psu_ok",
    "vigil_node_filesystem_readonly",
    "vigil_node_kubelet_ready",
)

NIC_METRICS: tuple[str, ...] = (
    "vigil_nic_link_up",
    "vigil_nic_speed_gbps",
    "vigil_nic_rx_bytes_total",
    "vigil_nic_tx_bytes_total",
    "vigil_nic_symbol_errors_total",
    "vigil_nic_link_downed_total",
)

JOB_METRICS: tuple[str, ...] = (
    "vigil_job_steps_total",
    "vigil_job_step_time_seconds",
    "vigil_job_loss",
    "vigil_job_grad_norm",
    "vigil_job_tokens_per_second",
    "vigil_job_checkpoint_in_progress",
)

FAMILIES: dict[str, tuple[str, ...]] = {
    "gpu": GPU_METRICS,
    "node": NODE_METRICS,
    "nic": NIC_METRICS,
    "job": JOB_METRICS,
}

FB_TOTAL_MIB = 81559.0
PSU_TOTAL = 2.0
PCIE_WIDTH = 16.0


def index(family: str) -> dict[str, int]:
    return {m: i for i, m in enumerate(FAMILIES[family])}
