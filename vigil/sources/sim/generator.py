"""The simulator: a cluster running training jobs, faults injected with ground truth, and everything the real
sources would report - dcgm-exporter metrics, host / NIC / job metrics, NVRM Xid kernel lines, rank logs with
NCCL / CUDA / Python errors, Kubernetes-style events.

Deterministic for a given seed: ``SimRun.ticks()`` regenerates the same stream every time it is called, so a
10,000-GPU run never has to sit in memory at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from vigil.model import (
    Event,
    FaultLevel,
    GroundTruthFault,
    LogRecord,
    Topology,
    VigilInputError,
    parse_entity,
    rank_id,
)
from vigil.sources.sim import metrics as M
from vigil.sources.sim.cluster import build_topology
from vigil.sources.sim.faults import BY_NAME, CATALOGUE, FaultSpec, fault_spec
from vigil.store.metrics import MetricFrame

DEFAULT_START = 1_767_225_600.0  # 2026-01-01T00:00:00Z

CRASHES_JOB = {"gpu_dbe", "gpu_xid", "gpu_lost", "gpu_gsp_timeout", "gpu_row_remap_failure", "nic_lost",
               "node_hardware_failure", "kernel_panic", "gpu_oom"}
HANGS_JOB = {"link_down", "switch_failure", "job_hang"}
SLOWS_JOB = {"gpu_thermal": 1.12, "gpu_pcie_width_low": 1.06, "gpu_p2p_bw_low": 1.10, "nic_speed_low": 1.15,
             "straggler": 1.4, "fan_failure": 1.05}
NCCL_WATCHDOG_S = 600.0


@dataclass(frozen=True)
class FaultPlan:
    """An explicit injection: fault type, entity id, start and duration in seconds from the run's start."""

    fault_type: str
    entity: str
    start_s: float
    duration_s: float


@dataclass
class SimConfig:
    nodes: int = 16
    gpus: int = 8
    minutes: float = 60.0
    seed: int = 0
    interval_s: float = 10.0
    nodes_per_switch: int = 4
    job_nodes: int | None = None
    faults_per_node_hour: float = 0.6
    fault_types: tuple[str, ...] | None = None
    plans: tuple[FaultPlan, ...] | None = None
    benign_noise: bool = True
    warmup_min: float = 6.0
    start_ts: float = DEFAULT_START

    def validate(self) -> None:
        if self.nodes < 1 or self.gpus < 1 or self.minutes <= 0 or self.interval_s <= 0:
            raise VigilInputError("simulation needs nodes >= 1, gpus >= 1, minutes > 0 and interval_s > 0")
        for name in self.fault_types or ():
            fault_spec(name)


@dataclass
class Tick:
    ts: float
    frames: list[MetricFrame]
    events: list[Event]

    @property
    def sample_count(self) -> int:
        return sum(f.sample_count for f in self.frames)


@dataclass
class _Fault:
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


class SimRun:
    """One simulated run: topology, ground truth, events and logs up front; metrics tick by tick."""

    def __init__(self, config: SimConfig) -> None:
        config.validate()
        self.config = config
        self.topology: Topology = build_topology(config.nodes, config.gpus, config.nodes_per_switch,
                                                 job_nodes=config.job_nodes)
        self.start_ts = config.start_ts
        self.n_ticks = max(1, int(round(config.minutes * 60 / config.interval_s)))
        self.end_ts = self.start_ts + (self.n_ticks - 1) * config.interval_s
        self._index()
        rng = np.random.default_rng(config.seed)
        self._faults = self._schedule(rng)
        self.events: list[Event] = []
        self.logs: list[LogRecord] = []
        self._checkpoints = self._schedule_checkpoints(rng)
        for fault in self._faults:
            self._fault_records(fault, rng)
        if config.benign_noise:
            self._benign_records(rng)
        self._job_records()
        self.events.sort(key=lambda e: e.ts)
        self.logs.sort(key=lambda r: (r.ts or 0.0))
        self.ground_truth: list[GroundTruthFault] = [f.truth for f in self._faults]

    # ------------------------------------------------------------------ indexing

    def _index(self) -> None:
        topo = self.topology
        self.node_ids = [n.id for n in topo.nodes]
        self.gpu_ids = [g.id for n in topo.nodes for g in n.gpus]
        self.nic_ids = [c.id for n in topo.nodes for c in n.nics]
        self.job_ids = [j.entity for j in topo.jobs]
        self._node_pos = {n.name: i for i, n in enumerate(topo.nodes)}
        self._gpu_pos = {g: i for i, g in enumerate(self.gpu_ids)}
        self._nic_pos = {c: i for i, c in enumerate(self.nic_ids)}
        self.gpu_node = np.repeat(np.arange(len(topo.nodes)), self.config.gpus)
        self.nic_node = self.gpu_node.copy()
        self.node_job = np.full(len(topo.nodes), -1)
        self.gpu_job = np.full(len(self.gpu_ids), -1)
        self.gpu_rank = np.full(len(self.gpu_ids), -1)
        for j, job in enumerate(topo.jobs):
            for r, gpu in enumerate(job.placement):
                pos = self._gpu_pos[gpu]
                self.gpu_job[pos] = j
                self.gpu_rank[pos] = r
                self.node_job[self.gpu_node[pos]] = j
        self._switch_nodes = {s.name: [self._node_pos[n.name] for n in topo.nodes_under(s.name)]
                              for s in topo.switches if s.tier == "leaf"}

    def gpu_of_rank(self, job: int, rank: int) -> int:
        return self._gpu_pos[self.topology.jobs[job].placement[rank]]

    # ------------------------------------------------------------------ fault schedule

    def _schedule(self, rng: np.random.Generator) -> list[_Fault]:
        cfg = self.config
        total_s = self.n_ticks * cfg.interval_s
        faults: list[_Fault] = []
        footprints: list[tuple[float, float, set[int], set[int], set[int]]] = []
        if cfg.plans is not None:
            for plan in cfg.plans:
                spec = fault_spec(plan.fault_type)
                fault = self._make_fault(spec, plan.entity, self.start_ts + plan.start_s, plan.duration_s, rng)
                faults.append(fault)
            return faults
        specs = [BY_NAME[n] for n in cfg.fault_types] if cfg.fault_types else list(CATALOGUE)
        weights = np.array([s.weight for s in specs], dtype=float)
        weights /= weights.sum()
        hours = cfg.minutes / 60.0
        wanted = int(round(cfg.faults_per_node_hour * cfg.nodes * hours))
        attempts = 0
        while len(faults) < wanted and attempts < wanted * 30:
            attempts += 1
            spec = specs[int(rng.choice(len(specs), p=weights))]
            duration = float(rng.uniform(*spec.duration_min)) * 60.0
            earliest = cfg.warmup_min * 60.0 + spec.precursor_min * 60.0
            latest = total_s - 6 * 60.0
            if latest <= earliest:
                continue
            onset = self.start_ts + float(rng.uniform(earliest, latest))
            entity = self._pick_entity(spec, rng)
            fault = self._make_fault(spec, entity, onset, duration, rng)
            lo = fault.precursor_start - 120.0
            hi = max(fault.end, fault.onset + 900.0 if spec.name in HANGS_JOB | CRASHES_JOB else fault.end) + 120.0
            nodes = set(fault.nodes) | {int(self.gpu_node[g]) for g in fault.gpus} | {int(self.nic_node[c])
                                                                                      for c in fault.nics}
            excl_jobs = set(fault.jobs) if spec.target in ("job", "rank") else set()
            shared_jobs = {int(self.node_job[n]) for n in nodes} - {-1}
            clash = any(lo < f_hi and f_lo < hi and (nodes & f_nodes or excl_jobs & (f_ex | f_sh)
                                                      or f_ex & (excl_jobs | shared_jobs))
                        for f_lo, f_hi, f_nodes, f_ex, f_sh in footprints)
            if clash:
                continue
            footprints.append((lo, hi, nodes, excl_jobs, shared_jobs))
            faults.append(fault)
        faults.sort(key=lambda f: f.onset)
        return faults

    def _pick_entity(self, spec: FaultSpec, rng: np.random.Generator) -> str:
        topo = self.topology
        if spec.target == "gpu":
            return self.gpu_ids[int(rng.integers(len(self.gpu_ids)))]
        if spec.target == "node":
            return self.node_ids[int(rng.integers(len(self.node_ids)))]
        if spec.target == "nic":
            return self.nic_ids[int(rng.integers(len(self.nic_ids)))]
        if spec.target == "switch":
            leaves = sorted(self._switch_nodes)
            return f"switch/{leaves[int(rng.integers(len(leaves)))]}"
        job = topo.jobs[int(rng.integers(len(topo.jobs)))]
        if spec.target == "job":
            return job.entity
        return rank_id(job.id, int(rng.integers(job.world_size)))

    def _make_fault(self, spec: FaultSpec, entity: str, onset: float, duration_s: float,
                    rng: np.random.Generator) -> _Fault:
        kind, parts = parse_entity(entity)
        expected = {"gpu": "gpu", "node": "node", "nic": "nic", "switch": "switch", "job": "job", "rank": "rank"}
        if expected[spec.target] != kind:
            raise VigilInputError(f"fault {spec.name!r} needs a {spec.target} entity, got {entity!r}")
        end = min(onset + duration_s, self.end_ts + self.config.interval_s)
        truth = GroundTruthFault(fault_type=spec.name, entity=entity, start=onset, end=end,
                                 visible_to_rules=spec.visible_to_rules,
                                 attrs={"level": spec.level.label, "precursor_s": spec.precursor_min * 60.0})
        fault = _Fault(spec=spec, truth=truth, onset=onset, end=end,
                       precursor_start=onset - spec.precursor_min * 60.0,
                       magnitude=float(rng.uniform(0.8, 1.2)))
        try:
            if kind == "gpu":
                fault.gpus = [self._gpu_pos[entity]]
            elif kind == "node":
                fault.nodes = [self._node_pos[parts[0]]]
            elif kind == "nic":
                fault.nics = [self._nic_pos[entity]]
            elif kind == "switch":
                fault.nodes = list(self._switch_nodes[parts[0]])
                fault.nics = [i for i in range(len(self.nic_ids)) if int(self.nic_node[i]) in fault.nodes]
            elif kind == "job":
                fault.jobs = [self.job_ids.index(entity)]
            else:
                j = self.job_ids.index(f"job/{parts[0]}")
                fault.jobs = [j]
                fault.rank = int(parts[1])
                if fault.rank >= self.topology.jobs[j].world_size:
                    raise ValueError
                fault.gpus = [self.gpu_of_rank(j, fault.rank)]
        except (KeyError, ValueError):
            raise VigilInputError(f"fault {spec.name!r}: entity {entity!r} is not in the simulated cluster") from None
        return fault

    def _affected_jobs(self, fault: _Fault) -> list[int]:
        nodes = set(fault.nodes) | {int(self.gpu_node[g]) for g in fault.gpus} | {int(self.nic_node[c])
                                                                                for c in fault.nics}
        jobs = set(fault.jobs) | {int(self.node_job[n]) for n in nodes}
        return sorted(jobs - {-1})

    def _schedule_checkpoints(self, rng: np.random.Generator) -> list[list[tuple[float, float]]]:
        """Each job saves a checkpoint every 30 minutes; progress pauses for 60-90 s (not a hang)."""
        out = []
        for _ in self.topology.jobs:
            first = self.start_ts + float(rng.uniform(5, 30)) * 60.0
            windows = []
            t = first
            while t < self.end_ts:
                windows.append((t, t + float(rng.uniform(60, 90))))
                t += 1800.0
            out.append(windows)
        return out

    # ------------------------------------------------------------------ events and logs

    def _kernel(self, node: int, ts: float, text: str) -> None:
        stamp = datetime.fromtimestamp(ts, UTC).strftime("%a %b %e %H:%M:%S %Y")
        self.logs.append(LogRecord(ts=ts, entity=self.node_ids[node], source="kernel", line=f"[{stamp}] {text}"))

    def _xid(self, gpu: int, ts: float, code: int, message: str, pid: int = 48213) -> None:
        node = int(self.gpu_node[gpu])
        bus = self.topology.nodes[node].gpus[gpu % self.config.gpus].pci_bus_id.rsplit(".", 1)[0]
        line = f"NVRM: Xid (PCI:{bus}): {code}, pid={pid}, name=python, {message}"
        self._kernel(node, ts, line)
        self.events.append(Event(ts=ts, entity=self.gpu_ids[gpu], kind="xid", source="kernel", message=line,
                                 level=FaultLevel.OBSERVE, attrs={"xid": code, "pci_bus": bus}))

    def _event(self, ts: float, entity: str, kind: str, source: str, message: str, **attrs: object) -> None:
        self.events.append(Event(ts=ts, entity=entity, kind=kind, source=source, message=message, attrs=attrs))

    def _rank_log(self, job: int, rank: int, ts: float, line: str) -> None:
        jid = self.topology.jobs[job].id
        self.logs.append(LogRecord(ts=ts, entity=rank_id(jid, rank), source="rank", line=line))

    def _torch_stamp(self, ts: float) -> str:
        return datetime.fromtimestamp(ts, UTC).strftime("%m%d %H:%M:%S.%f")

    def _crash_logs(self, job: int, root_rank: int | None, ts: float, root_lines: list[str]) -> None:
        """The root error on one rank, then the cascade on every other rank."""
        world = self.topology.jobs[job].world_size
        if root_rank is not None:
            for k, line in enumerate(root_lines):
                self._rank_log(job, root_rank, ts + 0.001 * k, line)
        for r in range(world):
            if r == root_rank:
                continue
            self._rank_log(job, r, ts + 2.0 + 0.01 * r,
                           f"[rank{r}]:[E{self._torch_stamp(ts + 2.0)} 4821{r % 10} ProcessGroupNCCL.cpp:1895] "
                           f"[PG ID 0 PG GUID 0(default_pg) Rank {r}] Process group watchdog thread terminated with "
                           "exception: NCCL error: remote process exited or there was a network error, "
                           "NCCL version 2.21.5")

    def _hang_logs(self, job: int, culprit: int | None, onset: float) -> None:
        world = self.topology.jobs[job].world_size
        ts = onset + NCCL_WATCHDOG_S
        if ts > self.end_ts:
            return
        for r in range(world):
            if r == culprit:
                continue
            self._rank_log(job, r, ts + 0.01 * r,
                           f"[rank{r}]:[E{self._torch_stamp(ts)} 4821{r % 10} ProcessGroupNCCL.cpp:616] [Rank {r}] "
                           "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=18231, OpType=ALLREDUCE, "
                           "NumelIn=262144000, NumelOut=262144000, Timeout(ms)=600000) ran for 600043 milliseconds "
                           "before timing out.")

    def _job_down_events(self, job: int, ts: float, reason: str, restart_after: float, rank: int | None = None,
                         exit_reason: str = "") -> None:
        jid = self.topology.jobs[job]
        attrs: dict[str, object] = {"reason": reason, "exit_reason": exit_reason}
        if rank is not None:
            attrs["rank"] = rank
        self._event(ts, jid.entity, "job", "launcher", f"job {jid.id} {reason}: {exit_reason}".strip(), **attrs)
        self._event(ts + 5, jid.entity, "k8s", "kubernetes", "Back-off restarting failed container",
                    type="Warning", reason="BackOff", object=f"Pod/{jid.name}-worker-{rank or 0}")
        if ts + restart_after <= self.end_ts:
            self._event(ts + restart_after, jid.entity, "job", "launcher",
                        f"job {jid.id} restarted from the latest checkpoint", reason="restarted", exit_reason="")

    def _fault_records(self, f: _Fault, rng: np.random.Generator) -> None:
        name, t0 = f.spec.name, f.onset
        gpu = f.gpus[0] if f.gpus else None
        node = (int(self.gpu_node[gpu]) if gpu is not None else
                int(self.nic_node[f.nics[0]]) if f.nics else f.nodes[0] if f.nodes else None)
        jobs = self._affected_jobs(f)
        root_rank = int(self.gpu_rank[gpu]) if gpu is not None else None
        if root_rank is None and f.nics:
            root_rank = int(self.gpu_rank[f.nics[0]])  # rail-aligned: NIC k serves GPU k
        if root_rank is None and node is not None and self.node_job[node] >= 0:
            root_rank = int(self.gpu_rank[node * self.config.gpus])
        restart = float(rng.uniform(180, 300))
        tb = ["Traceback (most recent call last):",
              '  File "/workspace/train.py", line 214, in <module>', "    main()",
              '  File "/workspace/train.py", line 187, in main', "    loss.backward()"]
        if name == "gpu_dbe":
            assert gpu is not None
            self._xid(gpu, t0, 48, "An uncorrectable double bit error (DBE) has been detected on GPU in the "
                      "framebuffer at partition 0, subpartition 0.")
            lines = [*tb, "RuntimeError: CUDA error: uncorrectable ECC error encountered"]
        elif name == "gpu_xid":
            assert gpu is not None
            code = int(rng.choice([62, 109]))
            self._xid(gpu, t0, code, {62: "Internal micro-controller halt",
                                      109: "CTX SWITCH TIMEOUT, Info 0x1c00e"}[code])
            lines = [*tb, "RuntimeError: CUDA error: unspecified launch failure"]
        elif name == "gpu_lost":
            assert gpu is not None
            self._xid(gpu, t0, 79, "GPU has fallen off the bus.", pid=0)
            lines = [*tb, "RuntimeError: CUDA error: unknown error"]
        elif name == "gpu_gsp_timeout":
            assert gpu is not None
            for k in range(3):
                self._xid(gpu, t0 + 6 * k, 119, f"Timeout after 6s of waiting for RPC response from GPU{gpu % 8} GSP! "
                          "Expected function 76 (GSP_RM_CONTROL) (0x20801813 0x4c).")
            lines = ["torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                     "ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
                     "NCCL version 2.21.5"]
        elif name == "gpu_sbe_storm":
            assert gpu is not None
            self._xid(gpu, t0 + 30, 92, "High single-bit ECC error rate")
            lines = []
        elif name == "nvlink_error":
            assert gpu is not None
            self._xid(gpu, t0 + 20, 74, "NVLink: fatal error detected on link 5(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")
            lines = []
        elif name == "gpu_row_remap_failure":
            assert gpu is not None
            self._xid(gpu, t0, 64, "Row remapping failure (bank 3, row 0x1a2b)")
            lines = [*tb, "RuntimeError: CUDA error: uncorrectable ECC error encountered"]
        elif name == "gpu_oom":
            lines = [*tb, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a "
                     "total capacity of 79.10 GiB of which 1.12 GiB is free. Process 48213 has 77.97 GiB memory "
                     "in use."]
        elif name in ("link_down", "switch_failure"):
            nics = f.nics
            for c in nics[: 64]:
                n = int(self.nic_node[c])
                self._kernel(n, t0, f"mlx5_core 0000:{0x18 + c % 8 * 16:02x}:00.0 {self.nic_ids[c].rsplit('/', 1)[1]}: "
                             "Link down")
                self._event(t0, self.nic_ids[c], "kernel", "kernel", "mlx5 link down", signature="mlx5_link_down")
            lines = [f"{self.node_ids[node or 0].split('/')[1]}:48213:48890 [{(root_rank or 0) % 8}] NCCL WARN "
                     "NET/IB : Got completion from peer 10.0.3.17<36127> with status=12 opcode=0 len=0 vendor err "
                     "129 (Recv) localGid ::ffff:10.0.1.4"]
        elif name == "nic_lost":
            assert node is not None
            self._kernel(node, t0, f"mlx5_core 0000:{0x18 + f.nics[0] % 8 * 16:02x}:00.0: mlx5_health_try_recover:"
                         "345: health recovery flow aborted, PCI reads still not working")
            self._event(t0, self.nic_ids[f.nics[0]], "kernel", "kernel", "NIC health compromised",
                        signature="mlx5_health")
            lines = ["NCCL WARN NET/IB : ibv_poll_cq error 5, vendor err 244"]
        elif name == "rnic_gid_error":
            assert node is not None
            self._kernel(node, t0, f"infiniband {self.nic_ids[f.nics[0]].rsplit('/', 1)[1]}: "
                         "update_gid_table: GID table entry 3 invalid, RoCE v2 GID missing")
            self._event(t0, self.nic_ids[f.nics[0]], "kernel", "kernel", "RoCE GID table error",
                        signature="rnic_gid_error")
            lines = []
        elif name == "psu_failure":
            assert node is not None
            self._event(t0, self.node_ids[node], "ipmi_sel", "ipmi", "Power Supply #2 | Failure detected | Asserted")
            lines = []
        elif name == "fan_failure":
            assert node is not None
            self._event(t0, self.node_ids[node], "ipmi_sel", "ipmi", "Fan 3 | Lower Critical going low | Asserted")
            lines = []
        elif name == "cpu_mce":
            assert node is not None
            self._kernel(node, t0, "mce: [Hardware Error]: CPU 12: Machine Check Exception: 5 Bank 7: "
                         "be00000000800400")
            self._kernel(node, t0 + 0.1, "mce: [Hardware Error]: Machine check events logged")
            self._event(t0, self.node_ids[node], "kernel", "kernel", "uncorrectable machine check", signature="mce")
            lines = []
        elif name == "fs_readonly":
            assert node is not None
            self._kernel(node, t0, "EXT4-fs error (device nvme0n1p2): ext4_journal_check_start:83: comm python: "
                         "Detected aborted journal")
            self._kernel(node, t0 + 0.2, "EXT4-fs (nvme0n1p2): Remounting filesystem read-only")
            self._event(t0, self.node_ids[node], "kernel", "kernel", "filesystem read-only", signature="fs_readonly")
            lines = []
        elif name in ("kubelet_down", "node_hardware_failure", "kernel_panic"):
            assert node is not None
            if name == "kernel_panic":
                self._kernel(node, t0, "Kernel panic - not syncing: Fatal exception in interrupt")
            self._event(t0 + 40, self.node_ids[node], "k8s", "kubernetes",
                        f"Node {self.topology.nodes[node].name} status is now: NodeNotReady",
                        type="Warning", reason="NodeNotReady", object=f"Node/{self.topology.nodes[node].name}")
            lines = [*tb, "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
                     "peer"] if name != "kubelet_down" else []
        else:
            lines = []

        if name in CRASHES_JOB:
            for j in jobs:
                rank = root_rank if (gpu is not None or f.nics or f.rank is not None) else None
                exit_reason = "CUDA out of memory" if name == "gpu_oom" else lines[-1] if lines else ""
                if name in ("node_hardware_failure", "kernel_panic"):
                    rank = root_rank
                self._crash_logs(j, rank, t0 + 1.0, lines)
                self._job_down_events(j, t0 + 3.0, "crashed", restart, rank, exit_reason)
        elif name in HANGS_JOB:
            for j in jobs:
                culprit = f.rank if name == "job_hang" else root_rank
                if name != "job_hang" and lines:
                    for k, line in enumerate(lines):
                        self._rank_log(j, culprit or 0, t0 + 1.0 + k, line)
                self._hang_logs(j, culprit, t0)
                down = t0 + NCCL_WATCHDOG_S
                if down < self.end_ts:
                    self._job_down_events(j, down, "crashed", 120.0, None, "NCCL watchdog timeout")
        elif name == "nan_loss":
            j = f.jobs[0]
            self._rank_log(j, 0, t0 + 1, f"[rank0] step loss is nan (grad_norm inf) at {self._torch_stamp(t0)}")
            if f.end <= self.end_ts:
                self._job_down_events(j, f.end, "stopped", 60.0, None, "loss is NaN; restarting from checkpoint")
        f.truth.attrs["jobs"] = [self.job_ids[j] for j in jobs]

    def _benign_records(self, rng: np.random.Generator) -> None:
        """Application Xids (13, 43) that a healthy cluster shows every day: observe, never page."""
        hours = self.config.minutes / 60.0
        count = int(rng.poisson(0.02 * len(self.gpu_ids) * hours))
        for _ in range(count):
            gpu = int(rng.integers(len(self.gpu_ids)))
            ts = self.start_ts + float(rng.uniform(0, self.n_ticks * self.config.interval_s))
            code = int(rng.choice([13, 43]))
            self._xid(gpu, ts, code, "Graphics Exception: ESR 0x405840=0x0" if code == 13 else
                      "Ch 00000008, intr 10000000")

    def _job_records(self) -> None:
        for j, job in enumerate(self.topology.jobs):
            self._event(self.start_ts, job.entity, "job", "launcher", f"job {job.id} running on {job.world_size} ranks",
                        reason="started", exit_reason="")
            for start, end in self._checkpoints[j]:
                self._event(start, job.entity, "job", "launcher", "checkpoint save started", reason="checkpoint_start",
                            exit_reason="")
                self._event(end, job.entity, "job", "launcher", "checkpoint save finished", reason="checkpoint_end",
                            exit_reason="")

    # ------------------------------------------------------------------ metrics

    def ticks(self) -> Iterator[Tick]:
        """Metric frames and the events of each interval, in time order (regenerated on every call)."""
        cfg = self.config
        rng = np.random.default_rng(cfg.seed + 7919)
        n_gpu, n_node, n_nic, n_job = len(self.gpu_ids), len(self.node_ids), len(self.nic_ids), len(self.job_ids)
        gi, ni, ci, ji = M.index("gpu"), M.index("node"), M.index("nic"), M.index("job")
        temp_offset = rng.normal(0, 2.0, n_gpu)
        fb_base = rng.normal(60000, 1500, n_gpu)
        counters = {
            "sbe": np.zeros(n_gpu), "dbe": np.zeros(n_gpu), "replay": np.zeros(n_gpu), "crc": np.zeros(n_gpu),
            "energy": np.zeros(n_gpu), "tx": np.zeros(n_gpu), "rx": np.zeros(n_gpu), "pviol": np.zeros(n_gpu),
            "tviol": np.zeros(n_gpu), "remapped_u": np.zeros(n_gpu), "remapped_c": np.zeros(n_gpu),
            "nic_rx": np.zeros(n_nic), "nic_tx": np.zeros(n_nic), "sym": np.zeros(n_nic), "downed": np.zeros(n_nic),
        }
        steps = np.zeros(n_job)
        xid_gauge = np.zeros(n_gpu)
        base_step = rng.uniform(1.8, 2.4, n_job)
        tokens_per_step = 4_194_304.0
        event_i = 0
        events = self.events
        for k in range(self.n_ticks):
            ts = self.start_ts + k * cfg.interval_s
            tick_events = []
            while event_i < len(events) and events[event_i].ts <= ts:
                tick_events.append(events[event_i])
                event_i += 1
            for ev in tick_events:
                if ev.kind == "xid":
                    xid_gauge[self._gpu_pos[ev.entity]] = ev.attrs["xid"]

            # --- job state: running / down / hung / checkpoint, slow factor
            job_state = np.zeros(n_job, dtype=np.int8)  # 0 run, 1 down, 2 hung, 3 checkpoint
            slow = np.ones(n_job)
            loss_mult = np.ones(n_job)
            grad_mult = np.ones(n_job)
            nan_job = np.zeros(n_job, dtype=bool)
            for j in range(n_job):
                if any(a <= ts < b for a, b in self._checkpoints[j]):
                    job_state[j] = 3
            gpu_util_override: dict[int, float] = {}
            for f in self._faults:
                if ts < f.precursor_start or ts >= max(f.end, f.onset + NCCL_WATCHDOG_S + 400):
                    continue
                name = f.spec.name
                active = f.onset <= ts < f.end
                for j in self._affected_jobs(f):
                    if name in CRASHES_JOB and f.onset <= ts < f.onset + 240:
                        job_state[j] = 1
                    elif name in HANGS_JOB and f.onset <= ts < min(f.end, f.onset + NCCL_WATCHDOG_S):
                        job_state[j] = 2
                    elif name in HANGS_JOB and f.onset + NCCL_WATCHDOG_S <= ts < f.onset + NCCL_WATCHDOG_S + 120:
                        job_state[j] = 1
                    elif name in SLOWS_JOB and active:
                        slow[j] *= 1 + (SLOWS_JOB[name] - 1) * f.magnitude
                    if name == "nan_loss" and active:
                        nan_job[j] = True
                    if name == "loss_spike" and active:
                        loss_mult[j] *= 1 + 3.5 * f.magnitude * math.exp(-(ts - f.onset) / 120.0)
                    if name == "vanishing_gradient" and active:
                        grad_mult[j] *= max(1e-3, math.exp(-(ts - f.onset) / 40.0))
                    if name == "silent_data_corruption" and active:
                        loss_mult[j] *= 1.02
                if name == "job_hang" and f.onset <= ts < min(f.end, f.onset + NCCL_WATCHDOG_S):
                    gpu_util_override[f.gpus[0]] = 0.0

            # --- GPU family
            running = (self.gpu_job >= 0) & (job_state[np.maximum(self.gpu_job, 0)] == 0)
            state_of_gpu = job_state[np.maximum(self.gpu_job, 0)]
            util = np.where(running, 96.0, np.where(state_of_gpu == 2, 100.0, np.where(state_of_gpu == 3, 25.0, 0.0)))
            util = np.clip(util + rng.normal(0, 1.5, n_gpu), 0, 100)
            tensor = np.where(running, 0.62, 0.0) + rng.normal(0, 0.01, n_gpu)
            sm_clock = np.full(n_gpu, 1980.0) + rng.normal(0, 8, n_gpu)
            temp = 38 + 0.36 * util + temp_offset + rng.normal(0, 0.6, n_gpu)
            power = 110 + 5.4 * np.where(running, util, util * 0.25) + rng.normal(0, 12, n_gpu)
            fb_used = np.where(self.gpu_job >= 0, fb_base, 500.0) + rng.normal(0, 200, n_gpu)
            width = np.full(n_gpu, M.PCIE_WIDTH)
            nvbw = np.where(running, 2.1e5, 0.0) * (1 + rng.normal(0, 0.03, n_gpu))
            throttle = np.zeros(n_gpu)
            remap_fail = np.zeros(n_gpu)
            gpu_missing = np.zeros(n_gpu, dtype=bool)
            counters["sbe"] += rng.random(n_gpu) < 0.0005
            counters["replay"] += (rng.random(n_gpu) < 0.002) * rng.integers(1, 5, n_gpu)
            counters["crc"] += (rng.random(n_gpu) < 0.001) * rng.integers(1, 4, n_gpu)

            # --- node and NIC families
            node_up = np.ones(n_node)
            fan = 9000 + rng.normal(0, 150, n_node)
            psu = np.full(n_node, M.PSU_TOTAL)
            fs_ro = np.zeros(n_node)
            kubelet = np.ones(n_node)
            link_up = np.ones(n_nic)
            speed = np.full(n_nic, M.NIC_RATED_GBPS)
            nic_missing = np.zeros(n_nic, dtype=bool)
            counters["sym"] += rng.random(n_nic) < 0.001

            for g, value in gpu_util_override.items():
                util[g] = value
            for f in self._faults:
                self._apply(f, ts, rng, util=util, temp=temp, sm_clock=sm_clock, fb_used=fb_used, width=width,
                            nvbw=nvbw, throttle=throttle, remap_fail=remap_fail, gpu_missing=gpu_missing,
                            counters=counters, node_up=node_up, fan=fan, psu=psu, fs_ro=fs_ro, kubelet=kubelet,
                            link_up=link_up, speed=speed, nic_missing=nic_missing, power=power)
            # a node that is down takes its GPUs and NICs with it; a fan failure heats the node's GPUs
            down_nodes = node_up == 0
            gpu_missing |= down_nodes[self.gpu_node]
            nic_missing |= down_nodes[self.nic_node]
            temp += np.clip(9000 - fan, 0, None)[self.gpu_node] / 600.0

            counters["energy"] += power * cfg.interval_s * 1000
            counters["tx"] += util * 1e6 * cfg.interval_s
            counters["rx"] += util * 1.1e6 * cfg.interval_s
            counters["tviol"] += (temp > 87) * cfg.interval_s * 1e6
            counters["nic_rx"] += np.where(link_up > 0, 2.0e9, 0) * cfg.interval_s
            counters["nic_tx"] += np.where(link_up > 0, 2.0e9, 0) * cfg.interval_s

            gpu = np.empty((n_gpu, len(M.GPU_METRICS)), dtype=np.float32)
            gpu[:, gi["DCGM_FI_DEV_GPU_UTIL"]] = np.round(util)
            gpu[:, gi["DCGM_FI_DEV_GPU_TEMP"]] = np.round(temp)
            gpu[:, gi["DCGM_FI_DEV_MEMORY_TEMP"]] = np.round(temp + 6)
            gpu[:, gi["DCGM_FI_DEV_POWER_USAGE"]] = power
            gpu[:, gi["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]] = counters["energy"]
            gpu[:, gi["DCGM_FI_DEV_FB_USED"]] = np.round(fb_used)
            gpu[:, gi["DCGM_FI_DEV_FB_FREE"]] = np.round(M.FB_TOTAL_MIB - fb_used)
            gpu[:, gi["DCGM_FI_DEV_SM_CLOCK"]] = np.round(sm_clock)
            gpu[:, gi["DCGM_FI_DEV_MEM_CLOCK"]] = 2619
            gpu[:, gi["DCGM_FI_DEV_MEM_COPY_UTIL"]] = np.round(util * 0.3)
            gpu[:, gi["DCGM_FI_DEV_XID_ERRORS"]] = xid_gauge
            gpu[:, gi["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"]] = counters["sbe"]
            gpu[:, gi["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]] = counters["dbe"]
            gpu[:, gi["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]] = counters["replay"]
            gpu[:, gi["DCGM_FI_DEV_PCIE_LINK_GEN"]] = 5
            gpu[:, gi["DCGM_FI_DEV_PCIE_LINK_WIDTH"]] = width
            gpu[:, gi["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"]] = counters["crc"]
            gpu[:, gi["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"]] = nvbw
            gpu[:, gi["DCGM_FI_DEV_ROW_REMAP_FAILURE"]] = remap_fail
            gpu[:, gi["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"]] = counters["remapped_u"]
            gpu[:, gi["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"]] = counters["remapped_c"]
            gpu[:, gi["DCGM_FI_DEV_POWER_VIOLATION"]] = counters["pviol"]
            gpu[:, gi["DCGM_FI_DEV_THERMAL_VIOLATION"]] = counters["tviol"]
            gpu[:, gi["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]] = throttle
            gpu[:, gi["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]] = util / 100 * 0.97
            gpu[:, gi["DCGM_FI_PROF_SM_ACTIVE"]] = util / 100 * 0.9
            gpu[:, gi["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]] = np.clip(tensor, 0, 1)
            gpu[:, gi["DCGM_FI_PROF_DRAM_ACTIVE"]] = util / 100 * 0.45
            gpu[:, gi["DCGM_FI_PROF_PCIE_TX_BYTES"]] = counters["tx"]
            gpu[:, gi["DCGM_FI_PROF_PCIE_RX_BYTES"]] = counters["rx"]
            gpu[gpu_missing] = np.nan

            node = np.empty((n_node, len(M.NODE_METRICS)), dtype=np.float32)
            node[:, ni["vigil_node_up"]] = node_up
            node[:, ni["vigil_node_cpu_utilization_ratio"]] = np.clip(0.3 + rng.normal(0, 0.03, n_node), 0, 1)
            node[:, ni["vigil_node_memory_used_bytes"]] = 6.4e11 + rng.normal(0, 1e9, n_node)
            node[:, ni["vigil_node_load1"]] = 40 + rng.normal(0, 3, n_node)
            node[:, ni["vigil_node_fan_speed_min_rpm"]] = np.round(fan)
            node[:, ni["vigil_node_psu_ok"]] = psu
            node[:, ni["vigil_node_filesystem_readonly"]] = fs_ro
            node[:, ni["vigil_node_kubelet_ready"]] = kubelet
            node[down_nodes, 1:] = np.nan

            nic = np.empty((n_nic, len(M.NIC_METRICS)), dtype=np.float32)
            nic[:, ci["vigil_nic_link_up"]] = link_up
            nic[:, ci["vigil_nic_speed_gbps"]] = np.where(link_up > 0, speed, 0)
            nic[:, ci["vigil_nic_rx_bytes_total"]] = counters["nic_rx"]
            nic[:, ci["vigil_nic_tx_bytes_total"]] = counters["nic_tx"]
            nic[:, ci["vigil_nic_symbol_errors_total"]] = counters["sym"]
            nic[:, ci["vigil_nic_link_downed_total"]] = counters["downed"]
            nic[nic_missing] = np.nan

            step_time = base_step * slow * (1 + rng.normal(0, 0.015, n_job))
            progressing = job_state == 0
            steps += np.where(progressing, np.floor(cfg.interval_s / step_time), 0)
            loss = (2.1 + 3.0 * np.exp(-steps / 4000.0)) * loss_mult * (1 + rng.normal(0, 0.006, n_job))
            loss = np.where(nan_job, np.nan, loss)
            grad = np.abs(0.85 * grad_mult * (1 + rng.normal(0, 0.08, n_job)))
            grad = np.where(nan_job, np.inf, grad)
            job = np.empty((n_job, len(M.JOB_METRICS)), dtype=np.float32)
            job[:, ji["vigil_job_steps_total"]] = steps
            job[:, ji["vigil_job_step_time_seconds"]] = np.where(progressing, step_time, np.nan)
            job[:, ji["vigil_job_loss"]] = np.where(progressing | nan_job, loss, np.nan)
            job[:, ji["vigil_job_grad_norm"]] = np.where(progressing | nan_job, grad, np.nan)
            job[:, ji["vigil_job_tokens_per_second"]] = np.where(progressing, tokens_per_step / step_time, 0.0)
            job[:, ji["vigil_job_checkpoint_in_progress"]] = job_state == 3

            frames = [
                MetricFrame(ts, "gpu", self.gpu_ids, M.GPU_METRICS, gpu),
                MetricFrame(ts, "node", self.node_ids, M.NODE_METRICS, node),
                MetricFrame(ts, "nic", self.nic_ids, M.NIC_METRICS, nic),
                MetricFrame(ts, "job", self.job_ids, M.JOB_METRICS, job),
            ]
            yield Tick(ts, frames, tick_events)

    def _apply(self, f: _Fault, ts: float, rng: np.random.Generator, **s: np.ndarray | dict[str, np.ndarray]) -> None:
        """Write one fault's effect on this tick's arrays (precursor, then the fault itself)."""
        name = f.spec.name
        if ts < f.precursor_start or ts >= f.end:
            return
        pre = ts < f.onset
        progress = (ts - f.precursor_start) / max(1.0, f.onset - f.precursor_start)
        c = s["counters"]
        assert isinstance(c, dict)
        arr = {k: v for k, v in s.items() if isinstance(v, np.ndarray)}
        mag = f.magnitude
        for g in f.gpus:
            if name == "gpu_dbe":
                if pre:
                    c["sbe"][g] += rng.integers(3, 12)
                elif c["dbe"][g] == 0:
                    c["dbe"][g] += rng.integers(1, 3)
                if not pre:
                    arr["util"][g] = 0
            elif name in ("gpu_lost", "gpu_gsp_timeout") and not pre:
                arr["gpu_missing"][g] = True
            elif name == "gpu_xid" and not pre:
                arr["util"][g] = 0
            elif name == "gpu_thermal":
                rise = 14 * mag * (progress if pre else 1.0)
                arr["temp"][g] += rise + (6 if not pre else 0)
                if not pre:
                    arr["sm_clock"][g] = 1410 + rng.normal(0, 20)
                    arr["throttle"][g] = M.THROTTLE_THERMAL
            elif name == "gpu_pcie_width_low":
                if pre:
                    c["replay"][g] += rng.integers(80, 300)
                else:
                    arr["width"][g] = 8 if mag > 1.0 else 4
                    c["replay"][g] += rng.integers(0, 20)
            elif name == "gpu_sbe_storm" and not pre:
                c["sbe"][g] += rng.integers(60, 400)
            elif name == "gpu_p2p_bw_low" and not pre:
                arr["nvbw"][g] *= 0.45
            elif name == "nvlink_error" and not pre:
                c["crc"][g] += rng.integers(100, 2000)
            elif name == "gpu_row_remap_failure" and not pre:
                arr["remap_fail"][g] = 1
                if c["remapped_u"][g] == 0:
                    c["remapped_u"][g] += 1
            elif name == "gpu_oom":
                if pre:
                    arr["fb_used"][g] = 60000 + 21000 * progress
                elif ts < f.onset + 240:
                    arr["fb_used"][g] = 500
            elif name == "straggler" and not pre:
                arr["sm_clock"][g] = 1980 / (1 + 0.5 * mag) + rng.normal(0, 10)
        for n in f.nodes:
            if name in ("node_hardware_failure", "kernel_panic") and not pre:
                arr["node_up"][n] = 0
            elif name == "psu_failure" and not pre:
                arr["psu"][n] = 1
            elif name == "fan_failure":
                arr["fan"][n] = 9000 - (7500 * progress if pre else 7600) * min(1.0, mag)
            elif name == "fs_readonly" and not pre:
                arr["fs_ro"][n] = 1
            elif name == "kubelet_down" and not pre:
                arr["kubelet"][n] = 0
        for nic in f.nics:
            if name == "link_down":
                if pre and rng.random() < 0.3:
                    c["downed"][nic] += 1
                    c["sym"][nic] += rng.integers(5, 50)
                elif not pre:
                    arr["link_up"][nic] = 0
            elif name == "switch_failure" and not pre:
                arr["link_up"][nic] = 0
            elif name == "nic_speed_low" and not pre:
                arr["speed"][nic] = 200 if mag > 1.0 else 100
            elif name == "nic_lost" and not pre:
                arr["nic_missing"][nic] = True


def simulate(config: SimConfig | None = None) -> SimRun:
    return SimRun(config or SimConfig())


__all__ = ["FaultPlan", "SimConfig", "SimRun", "Tick", "simulate"]
