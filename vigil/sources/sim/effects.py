"""One registered effect function per catalogue fault: what the fault writes and how it bends the metrics.

An effect function describes its fault in one place. The simulator calls it twice through a ``Scene``:
once when the run is built (``phase == "records"``: the raw records the fault leaves - NVRM Xid lines,
mlx5 / EXT4 / mce kernel lines, IPMI SEL records, the root error in the rank log) and once per tick while
the fault is live (``phase == "tick"``: its precursor, then its effect on the metric arrays). Writers of the
other phase are no-ops, so the function reads top to bottom as the fault unfolds. How a fault hits its
jobs (crash, hang, slow down) is declared with the registration.

A new fault type is one entry in the fault catalogue (vigil/knowledge/data/kb/faults.yaml), one
``Rendering`` in ``faults.py`` and one function here.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from vigil.model import GroundTruthFault, Nic
from vigil.sources.sim.faults import FaultSpec

NCCL_WATCHDOG_S = 600.0
THROTTLE_THERMAL = 0x40  # DCGM clock throttle reason: HW thermal slowdown

GPU_ARRAYS = frozenset({"util", "temp", "sm_clock", "fb_used", "width", "nvbw", "throttle", "remap_fail",
                        "gpu_missing", "sbe", "dbe", "replay", "crc", "remapped_u"})
NODE_ARRAYS = frozenset({"node_up", "fan", "psu", "fs_ro", "kubelet"})
NIC_ARRAYS = frozenset({"link_up", "speed", "nic_missing", "downed", "sym"})
JOB_ARRAYS = frozenset({"loss_mult", "grad_mult", "nan_job"})

JobImpact = Literal["crash", "hang", "slow", "none"]
TRACEBACK = ("Traceback (most recent call last):", '  File "/workspace/train.py", line 214, in <module>',
             "    main()", '  File "/workspace/train.py", line 187, in main', "    loss.backward()")


@dataclass
class ActiveFault:
    """One injected fault: its spec, ground truth, timing and the positions of the entities it hits."""

    spec: FaultSpec
    truth: GroundTruthFault
    onset: float
    end: float
    precursor_start: float
    gpus: list[int] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    nics: list[int] = field(default_factory=list)
    jobs: list[int] = field(default_factory=list)
    rank: int | None = None
    magnitude: float = 1.0


class RecordWriter(Protocol):
    """What an effect may write into the run: raw records in the shapes real machines write them."""

    node_ids: list[str]
    nic_node: np.ndarray

    def write_kernel(self, node: int, ts: float, message: str) -> None: ...
    def write_xid(self, gpu: int, ts: float, code: int, message: str, pid: int = 48213) -> None: ...
    def write_event(self, ts: float, entity: str, kind: str, source: str, message: str) -> None: ...
    def write_node_not_ready(self, node: int, ts: float) -> None: ...
    def write_nan_loss(self, f: ActiveFault) -> None: ...
    def node_of_fault(self, f: ActiveFault) -> int: ...
    def nic(self, position: int) -> Nic: ...


@dataclass
class Scene:
    """What an effect function sees of the run: the fault, the phase, and writers for records and arrays."""

    run: RecordWriter
    fault: ActiveFault
    rng: np.random.Generator
    phase: Literal["records", "tick"]
    ts: float = 0.0
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    jobs: list[int] = field(default_factory=list)
    root_lines: list[str] = field(default_factory=list)
    exit_code: int | None = None

    # ------------------------------------------------------------ timing

    @property
    def pre(self) -> bool:
        """True in the precursor window, before the fault's onset."""
        return self.phase == "tick" and self.ts < self.fault.onset

    @property
    def progress(self) -> float:
        """0 -> 1 across the precursor window."""
        f = self.fault
        return (self.ts - f.precursor_start) / max(1.0, f.onset - f.precursor_start)

    @property
    def live(self) -> bool:
        """True on a tick after the onset: the fault itself, not its precursor."""
        return self.phase == "tick" and self.ts >= self.fault.onset

    @property
    def magnitude(self) -> float:
        return self.fault.magnitude

    # ------------------------------------------------------------ records (phase "records")

    def _records(self) -> bool:
        return self.phase == "records"

    def xid(self, code: int, message: str, at: float = 0.0, pid: int = 48213) -> None:
        if self._records():
            self.run.write_xid(self.fault.gpus[0], self.fault.onset + at, code, message, pid)

    def kernel(self, message: str, at: float = 0.0) -> None:
        if self._records():
            self.run.write_kernel(self.run.node_of_fault(self.fault), self.fault.onset + at, message)

    def nic_kernel(self, message: Callable[[int], str], at: float = 0.0, limit: int = 64) -> None:
        """One kernel line per NIC of the fault (a switch failure reports at most ``limit`` of them)."""
        if self._records():
            for nic in self.fault.nics[:limit]:
                self.run.write_kernel(int(self.run.nic_node[nic]), self.fault.onset + at, message(nic))

    def ipmi_sel(self, record: str) -> None:
        if self._records():
            node = self.run.node_of_fault(self.fault)
            self.run.write_event(self.fault.onset, self.run.node_ids[node], "ipmi_sel", "ipmi", record)

    def node_not_ready(self, at: float = 40.0) -> None:
        if self._records():
            self.run.write_node_not_ready(self.run.node_of_fault(self.fault), self.fault.onset + at)

    def root_log(self, *lines: str) -> None:
        """The root error the fault's rank writes before its job goes down."""
        if self._records():
            self.root_lines.extend(lines)

    def killed_by(self, signum: int) -> None:
        """The fault's rank is ended by ``signum`` without a word of its own: its launcher reports exit code
        -signum, as ``vigil launch`` does."""
        if self._records():
            self.exit_code = -signum

    # ------------------------------------------------------------ metrics (phase "tick")

    def _members(self, name: str) -> list[int]:
        f = self.fault
        if name in GPU_ARRAYS:
            return f.gpus
        if name in NODE_ARRAYS:
            return f.nodes
        if name in NIC_ARRAYS:
            return f.nics
        if name in JOB_ARRAYS:
            return self.jobs
        raise KeyError(name)

    def set(self, name: str, value: float) -> None:
        if self.phase == "tick":
            self.arrays[name][self._members(name)] = value

    def add(self, name: str, value: float | tuple[int, int]) -> None:
        """Add ``value`` to each member; a (low, high) pair draws an integer per member."""
        if self.phase != "tick":
            return
        for i in self._members(name):
            self.arrays[name][i] += self.rng.integers(*value) if isinstance(value, tuple) else value

    def scale(self, name: str, factor: float) -> None:
        if self.phase == "tick":
            self.arrays[name][self._members(name)] *= factor

    def unset(self, name: str) -> bool:
        """True while every member's value of ``name`` is still 0 (a counter that has not moved)."""
        return self.phase == "tick" and bool(np.all(self.arrays[name][self._members(name)] == 0))


EffectFn = Callable[[Scene], None]


@dataclass(frozen=True)
class Effect:
    name: str
    render: EffectFn
    jobs: JobImpact
    slowdown: float = 1.0


EFFECTS: dict[str, Effect] = {}


def effect(name: str, jobs: JobImpact = "none", slowdown: float = 1.0) -> Callable[[EffectFn], EffectFn]:
    """Register ``fn`` as the effect of catalogue fault ``name``; ``jobs`` says what it does to the jobs on
    its footprint (``slowdown`` is the step-time factor of a ``slow`` fault at magnitude 1)."""

    def register(fn: EffectFn) -> EffectFn:
        if name in EFFECTS:
            raise ValueError(f"fault {name!r} already has an effect")
        EFFECTS[name] = Effect(name, fn, jobs, slowdown)
        return fn

    return register


# ---------------------------------------------------------------- GPU


@effect("gpu_dbe", jobs="crash")
def gpu_dbe(s: Scene) -> None:
    s.xid(48, "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
          "subpartition 0.")
    s.root_log(*TRACEBACK, "RuntimeError: CUDA error: uncorrectable ECC error encountered")
    if s.pre:
        s.add("sbe", (3, 12))
        return
    if s.unset("dbe"):
        s.add("dbe", (1, 3))
    s.set("util", 0)


@effect("gpu_xid", jobs="crash")
def gpu_xid(s: Scene) -> None:
    if s.phase == "records":
        code = int(s.rng.choice([62, 109]))
        s.xid(code, {62: "Internal micro-controller halt", 109: "CTX SWITCH TIMEOUT, Info 0x1c00e"}[code])
    s.root_log(*TRACEBACK, "RuntimeError: CUDA error: unspecified launch failure")
    if s.live:
        s.set("util", 0)


@effect("gpu_thermal", jobs="slow", slowdown=1.12)
def gpu_thermal(s: Scene) -> None:
    s.add("temp", 14 * s.magnitude * (s.progress if s.pre else 1.0) + (0 if s.pre else 6))
    if s.live:
        s.set("sm_clock", 1410 + s.rng.normal(0, 20))
        s.set("throttle", THROTTLE_THERMAL)


@effect("gpu_lost", jobs="crash")
def gpu_lost(s: Scene) -> None:
    s.xid(79, "GPU has fallen off the bus.", pid=0)
    s.root_log(*TRACEBACK, "RuntimeError: CUDA error: unknown error")
    if s.live:
        s.set("gpu_missing", True)


@effect("gpu_gsp_timeout", jobs="crash")
def gpu_gsp_timeout(s: Scene) -> None:
    for k in range(3):
        s.xid(119, f"Timeout after 6s of waiting for RPC response from GPU{s.fault.gpus[0] % 8} GSP! Expected "
              "function 76 (GSP_RM_CONTROL) (0x20801813 0x4c).", at=6.0 * k)
    s.root_log("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
               "ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
               "NCCL version 2.21.5")
    if s.live:
        s.set("gpu_missing", True)


@effect("gpu_pcie_width_low", jobs="slow", slowdown=1.06)
def gpu_pcie_width_low(s: Scene) -> None:
    if s.pre:
        s.add("replay", (80, 300))
        return
    s.set("width", 8 if s.magnitude > 1.0 else 4)
    s.add("replay", (0, 20))


@effect("gpu_sbe_storm")
def gpu_sbe_storm(s: Scene) -> None:
    s.xid(92, "High single-bit ECC error rate", at=30.0)
    if s.live:
        s.add("sbe", (60, 400))


@effect("gpu_p2p_bw_low", jobs="slow", slowdown=1.10)
def gpu_p2p_bw_low(s: Scene) -> None:
    if s.live:
        s.scale("nvbw", 0.45)


@effect("silent_data_corruption")
def silent_data_corruption(s: Scene) -> None:
    if s.live:
        s.scale("loss_mult", 1.02)


@effect("nvlink_error")
def nvlink_error(s: Scene) -> None:
    s.xid(74, "NVLink: fatal error detected on link 5(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)", at=20.0)
    if s.live:
        s.add("crc", (100, 2000))


@effect("gpu_row_remap_failure", jobs="crash")
def gpu_row_remap_failure(s: Scene) -> None:
    s.xid(64, "Row remapping failure (bank 3, row 0x1a2b)")
    s.root_log(*TRACEBACK, "RuntimeError: CUDA error: uncorrectable ECC error encountered")
    if s.live:
        s.set("remap_fail", 1)
        if s.unset("remapped_u"):
            s.add("remapped_u", 1)


# ---------------------------------------------------------------- NIC and fabric


def _mlx5(s: Scene, nic: int) -> str:
    """``mlx5_core <pci> <netdev>`` as the driver prefixes its lines; the netdev follows systemd's
    predictable naming (enp<bus>s<slot>np<port>)."""
    pci = s.run.nic(nic).pci_bus_id
    return f"mlx5_core {pci} enp{int(pci.split(':')[1], 16)}s0np0"


def _mlx5_pci(s: Scene, nic: int) -> str:
    return f"mlx5_core {s.run.nic(nic).pci_bus_id}"


_IB_COMPLETION_ERROR = ("NCCL WARN NET/IB : Got completion from peer 10.0.3.17<36127> with status=12 opcode=0 len=0 "
                        "vendor err 129 (Recv) localGid ::ffff:10.0.1.4")


@effect("link_down", jobs="hang")
def link_down(s: Scene) -> None:
    s.nic_kernel(lambda nic: f"{_mlx5(s, nic)}: Link down")
    s.root_log(_IB_COMPLETION_ERROR)
    if s.pre:
        if s.rng.random() < 0.3:
            s.add("downed", 1)
            s.add("sym", (5, 50))
        return
    s.set("link_up", 0)


@effect("switch_failure", jobs="hang")
def switch_failure(s: Scene) -> None:
    s.nic_kernel(lambda nic: f"{_mlx5(s, nic)}: Link down")
    s.root_log(_IB_COMPLETION_ERROR)
    if s.live:
        s.set("link_up", 0)


@effect("nic_speed_low", jobs="slow", slowdown=1.15)
def nic_speed_low(s: Scene) -> None:
    if s.live:
        s.set("speed", 200 if s.magnitude > 1.0 else 100)


@effect("nic_lost", jobs="crash")
def nic_lost(s: Scene) -> None:
    # the shapes mlx5_core's health poller writes (drivers/net/ethernet/mellanox/mlx5/core/health.c)
    s.nic_kernel(lambda nic: f"{_mlx5_pci(s, nic)}: poll_health:835:(pid 0): device's health compromised - "
                             "reached miss count")
    s.nic_kernel(lambda nic: f"{_mlx5_pci(s, nic)}: mlx5_health_try_recover:345:(pid 2311): health "
                             "recovery flow aborted, PCI reads still not working", at=0.2)
    s.root_log("NCCL WARN NET/IB : ibv_poll_cq error 5, vendor err 244")
    if s.live:
        s.set("nic_missing", True)


@effect("rnic_gid_error")
def rnic_gid_error(s: Scene) -> None:
    # ib_core's add_roce_gid (drivers/infiniband/core/cache.c) logs through dev_err on the IB device
    s.nic_kernel(lambda nic: f"infiniband {s.run.nic(nic).name}: add_roce_gid GID add failed "
                             "port=1 index=3")


# ---------------------------------------------------------------- node


@effect("psu_failure")
def psu_failure(s: Scene) -> None:
    s.ipmi_sel("Power Supply #0x51 | Failure detected | Asserted")
    if s.live:
        s.set("psu", 1)


@effect("fan_failure", jobs="slow", slowdown=1.05)
def fan_failure(s: Scene) -> None:
    s.ipmi_sel("Fan #0x33 | Lower Critical going low | Asserted")
    if s.phase == "tick":
        s.set("fan", 9000 - (7500 * s.progress if s.pre else 7600) * min(1.0, s.magnitude))


@effect("cpu_mce")
def cpu_mce(s: Scene) -> None:
    s.kernel("mce: [Hardware Error]: CPU 12: Machine Check Exception: 5 Bank 7: be00000000800400")
    s.kernel("mce: [Hardware Error]: Machine check events logged", at=0.1)


@effect("node_hardware_failure", jobs="crash")
def node_hardware_failure(s: Scene) -> None:
    s.node_not_ready()
    s.root_log(*TRACEBACK, "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
               "by peer")
    if s.live:
        s.set("node_up", 0)


@effect("fs_readonly")
def fs_readonly(s: Scene) -> None:
    s.kernel("EXT4-fs error (device nvme0n1p2): ext4_journal_check_start:83: comm python: Detected aborted journal")
    s.kernel("EXT4-fs (nvme0n1p2): Remounting filesystem read-only", at=0.2)
    if s.live:
        s.set("fs_ro", 1)


@effect("kubelet_down")
def kubelet_down(s: Scene) -> None:
    s.node_not_ready()
    if s.live:
        s.set("kubelet", 0)


@effect("kernel_panic", jobs="crash")
def kernel_panic(s: Scene) -> None:
    s.kernel("Kernel panic - not syncing: Fatal exception in interrupt")
    s.node_not_ready()
    s.root_log(*TRACEBACK, "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
               "by peer")
    if s.live:
        s.set("node_up", 0)


# ---------------------------------------------------------------- training


@effect("job_hang", jobs="hang")
def job_hang(s: Scene) -> None:
    if s.live and s.ts < s.fault.onset + NCCL_WATCHDOG_S:
        s.set("util", 0)


@effect("straggler", jobs="slow", slowdown=1.4)
def straggler(s: Scene) -> None:
    if s.live:
        s.set("sm_clock", 1980 / (1 + 0.5 * s.magnitude) + s.rng.normal(0, 10))


@effect("nan_loss")
def nan_loss(s: Scene) -> None:
    if s.phase == "records":
        s.run.write_nan_loss(s.fault)
    elif s.live:
        s.set("nan_job", True)


@effect("loss_spike")
def loss_spike(s: Scene) -> None:
    if s.live:
        s.scale("loss_mult", 1 + 3.5 * s.magnitude * float(np.exp(-(s.ts - s.fault.onset) / 120.0)))


@effect("vanishing_gradient")
def vanishing_gradient(s: Scene) -> None:
    if s.live:
        s.scale("grad_mult", max(1e-3, float(np.exp(-(s.ts - s.fault.onset) / 40.0))))


@effect("process_killed", jobs="crash")
def process_killed(s: Scene) -> None:
    s.killed_by(signal.SIGKILL)


@effect("application_error", jobs="crash")
def application_error(s: Scene) -> None:
    s.root_log(*TRACEBACK[:2], "    batch = next(loader)", "ValueError: bad batch at step 15: labels out of range")


@effect("gpu_oom", jobs="crash")
def gpu_oom(s: Scene) -> None:
    s.root_log(*TRACEBACK, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a "
               "total capacity of 79.10 GiB of which 1.12 GiB is free. Process 48213 has 77.97 GiB memory in use.")
    if s.pre:
        s.set("fb_used", 60000 + 21000 * s.progress)
    elif s.ts < s.fault.onset + 240:
        s.set("fb_used", 500)
