"""How the simulator renders each fault of the fault catalogue (vigil/knowledge/data/kb/faults.yaml).

What a fault is - its target entity kind, level and weight - comes from the catalogue: the weight is its
count in the real 348-day node fault trace of an LLM-pretraining cluster (stepfun-ai/InfiniteHBD-Trace, 400
servers, 584 faults; rows the trace files as "Unknown Error" / "Stress Test Failure" carry no class and are
left out) plus a documented pseudo-count for types the trace does not break out. Here the simulator adds only
how a fault unfolds: its duration, its precursor, whether metric rules can see it, and the signals it writes.

Rate: the trace's rate is 584 / (400 nodes x 348 days) = 1.75e-4 faults per node-hour. A demo hour on 16
nodes would see none, so the simulator compresses time: ``SimConfig.faults_per_node_hour`` sets the
absolute rate and the trace sets the relative one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vigil.knowledge.faults import fault_catalogue
from vigil.model import FaultLevel, VigilInputError


@dataclass(frozen=True)
class Rendering:
    """How one catalogue fault unfolds in the simulator."""

    duration_min: tuple[float, float] = (10.0, 20.0)
    precursor_min: float = 0.0
    visible_to_rules: bool = True
    signals: tuple[str, ...] = field(default_factory=tuple)
    # False: injected only when named (fault_types, plans), so adding it leaves every seeded default run as it was
    in_default_mix: bool = True


RENDERINGS: dict[str, Rendering] = {
    "gpu_dbe": Rendering(precursor_min=6, signals=(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL rising (precursor)", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Xid 48",
        "job crash on the rank")),
    "gpu_xid": Rendering(signals=("Xid 62/109 kernel line", "job crash")),
    "gpu_thermal": Rendering(precursor_min=5, signals=(
        "DCGM_FI_DEV_GPU_TEMP rising", "DCGM_FI_DEV_THERMAL_VIOLATION", "SM clock down")),
    "gpu_lost": Rendering(signals=("Xid 79", "GPU metrics absent", "job crash")),
    "gpu_gsp_timeout": Rendering(signals=("Xid 119 kernel lines", "GPU metrics stale")),
    "gpu_pcie_width_low": Rendering(precursor_min=4, signals=(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER rising (precursor)", "DCGM_FI_DEV_PCIE_LINK_WIDTH < 16")),
    "gpu_sbe_storm": Rendering(signals=("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL rate", "Xid 92")),
    "gpu_p2p_bw_low": Rendering(visible_to_rules=False, signals=(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL lower than peers", "job step time up")),
    "silent_data_corruption": Rendering(visible_to_rules=False, signals=(
        "loss drift on one data-parallel replica only",)),
    "nvlink_error": Rendering(signals=("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL rate", "Xid 74")),
    "gpu_row_remap_failure": Rendering(signals=("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Xid 64")),
    "link_down": Rendering(precursor_min=3, signals=(
        "vigil_nic_link_downed_total flaps (precursor)", "vigil_nic_link_up == 0", "NCCL IB completion errors",
        "job hang then crash")),
    "nic_speed_low": Rendering(signals=("vigil_nic_speed_gbps below rated", "job step time up")),
    "nic_lost": Rendering(signals=("NIC metrics absent", "kernel mlx5 health lines", "job crash")),
    "rnic_gid_error": Rendering(signals=("kernel log GID error", "NCCL connect failures")),
    "switch_failure": Rendering(signals=("all NICs under the switch down at once",)),
    "psu_failure": Rendering(signals=("vigil_node_psu_ok drops", "IPMI SEL record")),
    "fan_failure": Rendering(precursor_min=3, signals=("vigil_node_fan_speed_min_rpm low", "GPU temperatures rise")),
    "cpu_mce": Rendering(signals=("kernel mce lines",)),
    "node_hardware_failure": Rendering(signals=("vigil_node_up == 0", "NodeNotReady", "job crash")),
    "fs_readonly": Rendering(signals=("vigil_node_filesystem_readonly", "EXT4-fs error kernel lines")),
    "kubelet_down": Rendering(signals=("NodeNotReady event", "kubelet_ready 0")),
    "kernel_panic": Rendering(signals=("vigil_node_up == 0", "job crash")),
    "job_hang": Rendering(duration_min=(12, 16), signals=(
        "vigil_job_steps_total stops", "NCCL watchdog timeouts on the healthy ranks")),
    "straggler": Rendering(signals=("job step time up", "the rank's SM clock below its peers")),
    "nan_loss": Rendering(signals=("vigil_job_loss NaN", "grad norm inf")),
    "loss_spike": Rendering(duration_min=(3, 5), signals=("vigil_job_loss jumps",)),
    "vanishing_gradient": Rendering(duration_min=(20, 30), signals=(
        "5-minute average of vigil_job_grad_norm < 0.01",)),
    "process_killed": Rendering(signals=("rank exit code -9 (SIGKILL) from its launcher", "job crash")),
    "application_error": Rendering(in_default_mix=False, signals=(
        "a Python exception of the job's own code in the rank log", "job crash")),
    "gpu_oom": Rendering(precursor_min=3, signals=(
        "DCGM_FI_DEV_FB_USED at capacity", "torch.OutOfMemoryError in the rank log", "job crash")),
}


@dataclass(frozen=True)
class FaultSpec:
    """A catalogue fault as the simulator injects it."""

    name: str
    target: str  # gpu | node | nic | switch | job | rank
    level: FaultLevel
    description: str
    weight: float
    rendering: Rendering

    @property
    def duration_min(self) -> tuple[float, float]:
        return self.rendering.duration_min

    @property
    def precursor_min(self) -> float:
        return self.rendering.precursor_min

    @property
    def visible_to_rules(self) -> bool:
        return self.rendering.visible_to_rules

    @property
    def signals(self) -> tuple[str, ...]:
        return self.rendering.signals


def _catalogue() -> tuple[FaultSpec, ...]:
    """Every catalogue fault the simulator can render, in catalogue order."""
    catalogue = fault_catalogue()
    return tuple(FaultSpec(name, entry.target, entry.level, entry.title, catalogue.weight(name), RENDERINGS[name])
                 for name, entry in catalogue.faults.items() if name in RENDERINGS)


CATALOGUE: tuple[FaultSpec, ...] = _catalogue()
BY_NAME: dict[str, FaultSpec] = {spec.name: spec for spec in CATALOGUE}
TRAINING_FAULTS = frozenset(s.name for s in CATALOGUE if s.target in ("job", "rank"))


def fault_spec(name: str) -> FaultSpec:
    try:
        return BY_NAME[name]
    except KeyError:
        raise VigilInputError(f"unknown fault type {name!r}; known: {', '.join(sorted(BY_NAME))}") from None
