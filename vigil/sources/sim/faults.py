"""The fault catalogue: what can go wrong, on which entity, how often, and how it shows.

Mix: hardware and software faults are weighted by their counts in the real 348-day node fault trace of an
LLM-pretraining cluster (stepfun-ai/InfiniteHBD-Trace, 400 servers, 584 faults; ``trace`` below names the
(Level, Class, Desc) rows each type stands for). Rows the trace files as "Unknown Error" / "Stress Test
Failure" (253 of 584) carry no usable class and are left out. Types the trace does not break out (switch
failure, NVLink errors, row-remap failure) and training faults get documented synthetic weights.

Rate: the trace's rate is 584 / (400 nodes x 348 days) = 1.75e-4 faults per node-hour. A demo hour on 16
nodes would see none, so the simulator compresses time: ``SimConfig.faults_per_node_hour`` (default 0.75)
sets the absolute rate and the trace sets the relative one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vigil.model import FaultLevel

TRACE_NODE_HOURS = 400 * 348 * 24
TRACE_FAULTS = 584


@dataclass(frozen=True)
class FaultSpec:
    name: str
    target: str  # gpu | node | nic | switch | job | rank
    level: FaultLevel
    description: str
    trace: tuple[tuple[str, str, str, int], ...] = ()
    synthetic_weight: float = 0.0
    duration_min: tuple[float, float] = (10.0, 20.0)
    precursor_min: float = 0.0
    visible_to_rules: bool = True
    signals: tuple[str, ...] = field(default_factory=tuple)

    @property
    def trace_count(self) -> int:
        return sum(row[3] for row in self.trace)

    @property
    def weight(self) -> float:
        return float(self.trace_count) if self.trace else self.synthetic_weight


_HW, _SW, _OT = "Hardware Failure", "Software Failure", "Other Failure"

CATALOGUE: tuple[FaultSpec, ...] = (
    FaultSpec("gpu_dbe", "gpu", FaultLevel.ISOLATE, "uncorrectable double-bit ECC errors in HBM",
              ((_HW, "GPU", "GPU DBE(Double Bit ECC) > Threshold", 60),), precursor_min=6,
              signals=("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL rising (precursor)", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                       "Xid 48", "job crash on the rank")),
    FaultSpec("gpu_xid", "gpu", FaultLevel.DRAIN, "GPU engine stopped (Xid 62/109)",
              ((_HW, "GPU", "GPU xid Error", 11),), signals=("Xid 62/109 kernel line", "job crash")),
    FaultSpec("gpu_thermal", "gpu", FaultLevel.DEGRADED, "GPU overheating and throttling",
              ((_HW, "GPU", "GPU Temperature High", 2),), precursor_min=5,
              signals=("DCGM_FI_DEV_GPU_TEMP rising", "DCGM_FI_DEV_THERMAL_VIOLATION", "SM clock down")),
    FaultSpec("gpu_lost", "gpu", FaultLevel.ISOLATE, "GPU fell off the bus",
              ((_HW, "GPU", "GPU Lost", 5), (_HW, "GPU", "GPU device not found", 1)),
              signals=("Xid 79", "GPU metrics absent", "job crash")),
    FaultSpec("gpu_gsp_timeout", "gpu", FaultLevel.DRAIN, "GSP firmware RPC timeout; nvidia-smi hangs",
              ((_HW, "GPU", "GPU device unknow error", 40), (_HW, "GPU", "nvidia-smi Timeout", 9)),
              signals=("Xid 119 kernel lines", "GPU metrics stale")),
    FaultSpec("gpu_pcie_width_low", "gpu", FaultLevel.DRAIN, "PCIe link trained below x16",
              ((_HW, "GPU", "GPU PCI link width low", 25),), precursor_min=4,
              signals=("DCGM_FI_DEV_PCIE_REPLAY_COUNTER rising (precursor)", "DCGM_FI_DEV_PCIE_LINK_WIDTH < 16")),
    FaultSpec("gpu_sbe_storm", "gpu", FaultLevel.DEGRADED, "single-bit ECC error storm",
              ((_HW, "GPU", "GPU SBE(Single Bit ECC) > Threshold", 1),),
              signals=("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL rate", "Xid 92")),
    FaultSpec("gpu_p2p_bw_low", "gpu", FaultLevel.DEGRADED, "low GPU peer-to-peer bandwidth (degraded NVLink)",
              ((_HW, "GPU", "GPU P2P Bandwidth Low", 3),), visible_to_rules=False,
              signals=("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL lower than peers", "job step time up")),
    FaultSpec("silent_data_corruption", "gpu", FaultLevel.ISOLATE, "silent data corruption: wrong results, no error",
              ((_HW, "GPU", "Silent Data Corruption", 1),), visible_to_rules=False,
              signals=("loss drift on one data-parallel replica only",)),
    FaultSpec("nvlink_error", "gpu", FaultLevel.DEGRADED, "NVLink CRC errors",
              synthetic_weight=6, signals=("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL rate", "Xid 74")),
    FaultSpec("gpu_row_remap_failure", "gpu", FaultLevel.ISOLATE, "HBM row remapping failed",
              synthetic_weight=3, signals=("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Xid 64")),
    FaultSpec("link_down", "nic", FaultLevel.ISOLATE, "parameter-plane cable / optic down",
              ((_HW, "Parameter Plane Cable", "Link Down", 40),), precursor_min=3,
              signals=("vigil_nic_link_downed_total flaps (precursor)", "vigil_nic_link_up == 0",
                       "NCCL IB completion errors", "job hang then crash")),
    FaultSpec("nic_speed_low", "nic", FaultLevel.DRAIN, "NIC link negotiated below its rated speed",
              ((_HW, "NIC", "NIC Link Speed low", 10), (_HW, "NIC", "NIC PCI link Width low", 1)),
              signals=("vigil_nic_speed_gbps below rated", "job step time up")),
    FaultSpec("nic_lost", "nic", FaultLevel.ISOLATE, "NIC disappeared from the PCI bus",
              ((_HW, "NIC", "NIC Lost", 8),), signals=("NIC metrics absent", "kernel mlx5 errors", "job crash")),
    FaultSpec("rnic_gid_error", "nic", FaultLevel.DRAIN, "RoCE GID table error",
              ((_HW, "NIC", "Rnic Gid Error", 11),), signals=("kernel log GID error", "NCCL connect failures")),
    FaultSpec("switch_failure", "switch", FaultLevel.ISOLATE, "leaf switch failure: every node below loses its links",
              synthetic_weight=4, signals=("all NICs under the switch down at once",)),
    FaultSpec("psu_failure", "node", FaultLevel.DRAIN, "power supply failure / redundancy lost",
              ((_HW, "Power Supply", "Power Supply Failure detected", 25), (_HW, "Power Supply", "Redundancy Lost", 1)),
              signals=("vigil_node_psu_ok drops", "IPMI SEL event")),
    FaultSpec("fan_failure", "node", FaultLevel.DEGRADED, "fan speed critical",
              ((_HW, "Fan", "Speed Critical (Sensor)", 31), (_HW, "Fan", "Redundancy Lost", 2)), precursor_min=3,
              signals=("vigil_node_fan_speed_min_rpm low", "GPU temperatures rise")),
    FaultSpec("cpu_mce", "node", FaultLevel.DRAIN, "uncorrectable CPU machine check",
              ((_HW, "CPU", "Machine Check Exception ( Uncorrectable )", 2), (_HW, "CPU", "Configuration Error", 1)),
              signals=("kernel mce lines",)),
    FaultSpec("node_hardware_failure", "node", FaultLevel.ISOLATE, "motherboard / riser / RAID card failure: node down",
              ((_HW, "Motherboard", "Motherboard Failed", 4), (_HW, "Riser Card", "RiserCard Fault", 1),
               (_HW, "RAID Card", "Bus Correctable error", 1)),
              signals=("vigil_node_up == 0", "NodeNotReady", "job crash")),
    FaultSpec("fs_readonly", "node", FaultLevel.DRAIN, "local filesystem remounted read-only",
              ((_SW, "File System", "FS: Multiple Disk FS Error", 2), (_SW, "File System", "FS Readonly", 1)),
              signals=("vigil_node_filesystem_readonly", "EXT4-fs error kernel lines")),
    FaultSpec("kubelet_down", "node", FaultLevel.DRAIN, "kubelet stopped reporting",
              ((_SW, "Software Tool", "Kubelet Date Absent", 7),), signals=("NodeNotReady event", "kubelet_ready 0")),
    FaultSpec("kernel_panic", "node", FaultLevel.ISOLATE, "kernel panic / server down",
              ((_SW, "Operating System", "Kernel Panic", 1), (_OT, "System Crash", "Server down", 1)),
              signals=("vigil_node_up == 0", "job crash")),
    FaultSpec("job_hang", "rank", FaultLevel.DRAIN, "one rank stops; every other rank waits in a collective",
              synthetic_weight=10, duration_min=(12, 16),
              signals=("vigil_job_steps_total stops", "NCCL watchdog timeouts on the healthy ranks")),
    FaultSpec("straggler", "rank", FaultLevel.DEGRADED, "one rank is consistently slower; its peers wait",
              synthetic_weight=8, signals=("job step time up", "the rank's SM clock below its peers")),
    FaultSpec("nan_loss", "job", FaultLevel.DRAIN, "loss became NaN", synthetic_weight=5,
              signals=("vigil_job_loss NaN", "grad norm inf")),
    FaultSpec("loss_spike", "job", FaultLevel.DEGRADED, "loss spike", synthetic_weight=5, duration_min=(3, 5),
              signals=("vigil_job_loss jumps",)),
    FaultSpec("vanishing_gradient", "job", FaultLevel.DEGRADED, "gradient norm collapses",
              synthetic_weight=4, duration_min=(20, 30),
              signals=("5-minute average of vigil_job_grad_norm < 0.01",)),
    FaultSpec("gpu_oom", "rank", FaultLevel.DRAIN, "CUDA out of memory on one rank",
              synthetic_weight=6, precursor_min=3,
              signals=("DCGM_FI_DEV_FB_USED at capacity", "torch.OutOfMemoryError in the rank log", "job crash")),
)

BY_NAME: dict[str, FaultSpec] = {spec.name: spec for spec in CATALOGUE}
TRAINING_FAULTS = frozenset(s.name for s in CATALOGUE if s.target in ("job", "rank"))


def fault_spec(name: str) -> FaultSpec:
    try:
        return BY_NAME[name]
    except KeyError:
        from vigil.model import VigilInputError

        raise VigilInputError(f"unknown fault type {name!r}; known: {', '.join(sorted(BY_NAME))}") from None
