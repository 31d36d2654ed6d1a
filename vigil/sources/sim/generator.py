"""The simulator: a fake cluster running training jobs, faults injected with ground truth, and everything the
real machines would write, in their wire formats only - metric frames (rendered as dcgm-exporter pages by
``vigil.faces.api.dcgm``), raw kernel lines in ``dmesg --time-format iso`` shape (NVRM Xid, mlx5, ib_core,
mce, EXT4), IPMI SEL records as ipmitool prints them, Kubernetes events, launcher job states and rank logs
with NCCL / CUDA / Python errors. No record carries a label a real machine would not write: the production
decoders (``vigil.sources.replay``) turn the kernel lines into events. Ground truth stays beside the output for
evaluation only.

Each catalogue fault has one registered effect function (``effects.py``).

Deterministic for a given seed: ``SimRun.ticks()`` regenerates the same stream every time it is called, so a
10,000-GPU run never has to sit in memory at once.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from vigil.model import (
    Event,
    GroundTruthFault,
    LogRecord,
    Nic,
    Topology,
    VigilInputError,
    parse_entity,
    rank_id,
)
from vigil.sources.sim import metrics as M
from vigil.sources.sim.cluster import build_topology
from vigil.sources.sim.effects import EFFECTS, NCCL_WATCHDOG_S, ActiveFault, Scene
from vigil.sources.sim.faults import BY_NAME, CATALOGUE, FaultSpec, fault_spec
from vigil.store.metrics import MetricFrame

DEFAULT_START = 1_767_225_600.0  # 2026-01-01T00:00:00Z


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
    """One scrape interval: metric frames, the non-kernel records (IPMI, launcher), the raw kernel lines, the
    Kubernetes Event objects (the API's JSON, one per record) and the ranks' log lines written since the
    previous tick."""

    ts: float
    frames: list[MetricFrame]
    events: list[Event]
    kernel_lines: list[LogRecord] = field(default_factory=list)
    kube_events: list[LogRecord] = field(default_factory=list)
    rank_lines: list[LogRecord] = field(default_factory=list)

    @property
    def sample_count(self) -> int:
        return sum(f.sample_count for f in self.frames)


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
        # Kubernetes Event objects about nodes, as the API serves them (source "kubernetes", line = the JSON).
        self.kube_events: list[LogRecord] = []
        # (ts, gpu position, code) of every Xid written: dcgm-exporter's last-Xid gauge reads them
        self._xid_marks: list[tuple[float, int, int]] = []
        self._checkpoints = self._schedule_checkpoints(rng)
        for fault in self._faults:
            self._fault_records(fault, rng)
        if config.benign_noise:
            self._benign_records(rng)
        self._job_records()
        self.events.sort(key=lambda e: e.ts)
        self.logs.sort(key=lambda r: (r.ts or 0.0))
        self.kube_events.sort(key=lambda r: (r.ts or 0.0))
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

    def _schedule(self, rng: np.random.Generator) -> list[ActiveFault]:
        cfg = self.config
        total_s = self.n_ticks * cfg.interval_s
        faults: list[ActiveFault] = []
        footprints: list[tuple[float, float, set[int], set[int], set[int]]] = []
        if cfg.plans is not None:
            for plan in cfg.plans:
                spec = fault_spec(plan.fault_type)
                fault = self._make_fault(spec, plan.entity, self.start_ts + plan.start_s, plan.duration_s, rng)
                faults.append(fault)
            return faults
        specs = ([BY_NAME[n] for n in cfg.fault_types] if cfg.fault_types
                 else [s for s in CATALOGUE if s.rendering.in_default_mix])
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
            hi = max(fault.end, fault.onset + 900.0 if EFFECTS[spec.name].jobs in ("crash", "hang")
                     else fault.end) + 120.0
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
                    rng: np.random.Generator) -> ActiveFault:
        kind, parts = parse_entity(entity)
        expected = {"gpu": "gpu", "node": "node", "nic": "nic", "switch": "switch", "job": "job", "rank": "rank"}
        if expected[spec.target] != kind:
            raise VigilInputError(f"fault {spec.name!r} needs a {spec.target} entity, got {entity!r}")
        end = min(onset + duration_s, self.end_ts + self.config.interval_s)
        truth = GroundTruthFault(fault_type=spec.name, entity=entity, start=onset, end=end,
                                 visible_to_rules=spec.visible_to_rules,
                                 attrs={"level": spec.level.label, "precursor_s": spec.precursor_min * 60.0})
        fault = ActiveFault(spec=spec, truth=truth, onset=onset, end=end,
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

    def _affected_jobs(self, fault: ActiveFault) -> list[int]:
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

    def write_kernel(self, node: int, ts: float, message: str) -> None:
        """A kernel line as ``dmesg --time-format iso -x`` prints it."""
        stamp = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")
        self.logs.append(LogRecord(ts=ts, entity=self.node_ids[node], source="kernel",
                                   line=f"kern  :err   : {stamp} {message}"))

    def write_xid(self, gpu: int, ts: float, code: int, message: str, pid: int = 48213) -> None:
        """The NVRM line the driver writes for an Xid: ``NVRM: Xid (PCI:0000:18:00): 48, pid=..., name=..., ...``."""
        node = int(self.gpu_node[gpu])
        bus = self.topology.nodes[node].gpus[gpu % self.config.gpus].pci_bus_id.rsplit(".", 1)[0]
        self.write_kernel(node, ts, f"NVRM: Xid (PCI:{bus}): {code}, pid={pid}, name=python, {message}")
        self._xid_marks.append((ts, gpu, code))

    def relabel_xid(self, old: int, new: int) -> int:
        """Rewrite every Xid ``old`` the run wrote (kernel lines and dcgm-exporter's last-Xid gauge) as ``new``,
        the way a sibling code of the same fault family would appear; returns how many lines changed."""
        pattern = re.compile(rf"(NVRM: Xid \(PCI:[0-9A-Fa-f:.]+\): ){old},")
        changed = 0
        for k, record in enumerate(self.logs):
            if record.source == "kernel" and pattern.search(record.line):
                self.logs[k] = record.model_copy(update={"line": pattern.sub(rf"\g<1>{new},", record.line)})
                changed += 1
        self._xid_marks = [(ts, gpu, new if code == old else code) for ts, gpu, code in self._xid_marks]
        return changed

    def write_event(self, ts: float, entity: str, kind: str, source: str, message: str) -> None:
        self._event(ts, entity, kind, source, message)

    def write_node_not_ready(self, node: int, ts: float) -> None:
        """The node lifecycle controller's Event when it loses the node's kubelet (a Normal event, as it
        writes it)."""
        name = self.topology.nodes[node].name
        stamp = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        uid = hashlib.sha1(f"{name}|NodeNotReady|{ts:.3f}".encode()).hexdigest()
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{name}.{int(ts * 1e9):x}", "namespace": "default",
                         "uid": f"{uid[:8]}-{uid[8:12]}-{uid[12:16]}-{uid[16:20]}-{uid[20:32]}"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": name},
            "reason": "NodeNotReady", "message": f"Node {name} status is now: NodeNotReady",
            "source": {"component": "node-controller"}, "firstTimestamp": stamp, "lastTimestamp": stamp,
            "count": 1, "type": "Normal", "reportingComponent": "", "reportingInstance": "",
        }
        self.kube_events.append(LogRecord(ts=ts, entity=self.node_ids[node], source="kubernetes",
                                          line=json.dumps(event)))

    def write_nan_loss(self, f: ActiveFault) -> None:
        j, t0 = f.jobs[0], f.onset
        self._rank_log(j, 0, t0 + 1, f"[rank0] step loss is nan (grad_norm inf) at {self._torch_stamp(t0)}")
        if f.end <= self.end_ts:
            self._job_down_events(j, f.end, "stopped", 60.0, None, "loss is NaN; restarting from checkpoint")

    def nic(self, position: int) -> Nic:
        node = self.topology.nodes[int(self.nic_node[position])]
        return node.nics[position - int(self.nic_node[position]) * self.config.gpus]

    def node_of_fault(self, f: ActiveFault) -> int:
        if f.gpus:
            return int(self.gpu_node[f.gpus[0]])
        if f.nics:
            return int(self.nic_node[f.nics[0]])
        return f.nodes[0]

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
                         exit_reason: str = "", exit_code: int | None = None) -> None:
        jid = self.topology.jobs[job]
        attrs: dict[str, object] = {"reason": reason, "exit_reason": exit_reason}
        if rank is not None:
            attrs["rank"] = rank
        if exit_code is not None:
            attrs["exit_code"] = exit_code
        self._event(ts, jid.entity, "job", "launcher", f"job {jid.id} {reason}: {exit_reason}".strip(), **attrs)
        if ts + restart_after <= self.end_ts:
            self._event(ts + restart_after, jid.entity, "job", "launcher",
                        f"job {jid.id} restarted from the latest checkpoint", reason="restarted", exit_reason="")

    def _fault_records(self, f: ActiveFault, rng: np.random.Generator) -> None:
        """The fault's own records (its effect function), then what its jobs write as they crash or hang."""
        effect = EFFECTS[f.spec.name]
        scene = Scene(self, f, rng, "records")
        effect.render(scene)
        lines, t0 = scene.root_lines, f.onset
        gpu = f.gpus[0] if f.gpus else None
        node = self.node_of_fault(f) if (f.gpus or f.nics or f.nodes) else None
        jobs = self._affected_jobs(f)
        root_rank = int(self.gpu_rank[gpu]) if gpu is not None else None
        if root_rank is None and f.nics:
            root_rank = int(self.gpu_rank[f.nics[0]])  # rail-aligned: NIC k serves GPU k
        if root_rank is None and node is not None and self.node_job[node] >= 0:
            root_rank = int(self.gpu_rank[node * self.config.gpus])
        restart = float(rng.uniform(180, 300))
        if effect.jobs == "crash":
            for j in jobs:
                rank = root_rank if (gpu is not None or f.nics or f.rank is not None or f.nodes) else None
                self._crash_logs(j, rank, t0 + 1.0, lines)
                exit_reason = lines[-1] if lines else ""
                if scene.exit_code is not None and scene.exit_code < 0 and not lines:
                    exit_reason = f"rank {rank} killed by signal {signal.Signals(-scene.exit_code).name}"
                self._job_down_events(j, t0 + 3.0, "crashed", restart, rank, exit_reason, scene.exit_code)
        elif effect.jobs == "hang":
            for j in jobs:
                culprit = f.rank if f.spec.name == "job_hang" else root_rank
                for k, line in enumerate(lines):
                    self._rank_log(j, culprit or 0, t0 + 1.0 + k, line)
                self._hang_logs(j, culprit, t0)
                down = t0 + NCCL_WATCHDOG_S
                if down < self.end_ts:
                    self._job_down_events(j, down, "crashed", 120.0, None, "NCCL watchdog timeout")
        f.truth.attrs["jobs"] = [self.job_ids[j] for j in jobs]

    def _benign_records(self, rng: np.random.Generator) -> None:
        """Application Xids (13, 43) that a healthy cluster shows every day: observe, never page."""
        hours = self.config.minutes / 60.0
        count = int(rng.poisson(0.02 * len(self.gpu_ids) * hours))
        for _ in range(count):
            gpu = int(rng.integers(len(self.gpu_ids)))
            ts = self.start_ts + float(rng.uniform(0, self.n_ticks * self.config.interval_s))
            code = int(rng.choice([13, 43]))
            self.write_xid(gpu, ts, code, "Graphics Exception: ESR 0x405840=0x0" if code == 13 else
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
        rated_gbps = np.array([self.nic(c).speed_gbps for c in range(n_nic)])
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
        event_i = line_i = xid_i = 0
        events = self.events
        kernel_lines = [r for r in self.logs if r.source == "kernel"]
        kube_events, kube_i = self.kube_events, 0
        rank_lines, rank_i = [r for r in self.logs if r.source == "rank"], 0
        xid_marks = sorted(self._xid_marks)
        for k in range(self.n_ticks):
            ts = self.start_ts + k * cfg.interval_s
            tick_events = []
            while event_i < len(events) and events[event_i].ts <= ts:
                tick_events.append(events[event_i])
                event_i += 1
            tick_lines = []
            while line_i < len(kernel_lines) and (kernel_lines[line_i].ts or 0.0) <= ts:
                tick_lines.append(kernel_lines[line_i])
                line_i += 1
            tick_kube = []
            while kube_i < len(kube_events) and (kube_events[kube_i].ts or 0.0) <= ts:
                tick_kube.append(kube_events[kube_i])
                kube_i += 1
            tick_ranks = []
            while rank_i < len(rank_lines) and (rank_lines[rank_i].ts or 0.0) <= ts:
                tick_ranks.append(rank_lines[rank_i])
                rank_i += 1
            while xid_i < len(xid_marks) and xid_marks[xid_i][0] <= ts:
                xid_gauge[xid_marks[xid_i][1]] = xid_marks[xid_i][2]
                xid_i += 1

            # --- job state: running / down / hung / checkpoint, slow factor
            job_state = np.zeros(n_job, dtype=np.int8)  # 0 run, 1 down, 2 hung, 3 checkpoint
            slow = np.ones(n_job)
            loss_mult = np.ones(n_job)
            grad_mult = np.ones(n_job)
            nan_job = np.zeros(n_job, dtype=bool)
            for j in range(n_job):
                if any(a <= ts < b for a, b in self._checkpoints[j]):
                    job_state[j] = 3
            for f in self._faults:
                if ts < f.precursor_start or ts >= max(f.end, f.onset + NCCL_WATCHDOG_S + 400):
                    continue
                effect = EFFECTS[f.spec.name]
                active = f.onset <= ts < f.end
                for j in self._affected_jobs(f):
                    if effect.jobs == "crash" and f.onset <= ts < f.onset + 240:
                        job_state[j] = 1
                    elif effect.jobs == "hang" and f.onset <= ts < min(f.end, f.onset + NCCL_WATCHDOG_S):
                        job_state[j] = 2
                    elif effect.jobs == "hang" and f.onset + NCCL_WATCHDOG_S <= ts < f.onset + NCCL_WATCHDOG_S + 120:
                        job_state[j] = 1
                    elif effect.jobs == "slow" and active:
                        slow[j] *= 1 + (effect.slowdown - 1) * f.magnitude

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
            speed = rated_gbps.copy()
            nic_missing = np.zeros(n_nic, dtype=bool)
            counters["sym"] += rng.random(n_nic) < 0.001

            arrays = {**counters, "util": util, "temp": temp, "sm_clock": sm_clock, "fb_used": fb_used,
                      "width": width, "nvbw": nvbw, "throttle": throttle, "remap_fail": remap_fail,
                      "gpu_missing": gpu_missing, "node_up": node_up, "fan": fan, "psu": psu, "fs_ro": fs_ro,
                      "kubelet": kubelet, "link_up": link_up, "speed": speed, "nic_missing": nic_missing,
                      "loss_mult": loss_mult, "grad_mult": grad_mult, "nan_job": nan_job}
            for f in self._faults:
                if f.precursor_start <= ts < f.end:
                    EFFECTS[f.spec.name].render(Scene(self, f, rng, "tick", ts, arrays, self._affected_jobs(f)))
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
            yield Tick(ts, frames, tick_events, tick_lines, tick_kube, tick_ranks)


def simulate(config: SimConfig | None = None) -> SimRun:
    return SimRun(config or SimConfig())


__all__ = ["FaultPlan", "SimConfig", "SimRun", "Tick", "simulate"]
