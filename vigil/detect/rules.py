"""Rules: thresholds on DCGM / host / NIC / job metrics, Xid and kernel events, training-health checks, and the
one rank a job-wide collective timeout leaves out (``vigil.detect.silent_rank``).

Every rule is one row of a table (fault type, metric, condition) evaluated on a whole scrape with numpy, so
10,000 GPUs cost a few milliseconds per tick. A rule that keeps firing extends its open anomaly instead of
opening a new one; an anomaly closes once its condition has been clear for ``Thresholds.hold_s``.

What the rules know comes from the knowledge tables: a fault's level from the fault catalogue, counter or
gauge from the metric catalogue, an Xid's fault and level from the Xid table. Rated values come from the
machine itself: a NIC's rate from the topology (``Nic.speed_gbps``), a GPU's PCIe width from its own
``DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH`` where reported. A metric missing from a frame is simply not judged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel

from vigil.detect.base import StreamDetector
from vigil.detect.silent_rank import CollectiveTimeouts
from vigil.knowledge.faults import fault_level
from vigil.knowledge.metrics import family_metrics, is_counter
from vigil.knowledge.xid import xid_info
from vigil.model import Anomaly, Event, Evidence, FaultLevel, Topology, VigilInputError, rank_id
from vigil.store.metrics import MetricFrame

log = logging.getLogger(__name__)


class Thresholds(BaseModel):
    """Rule thresholds; defaults follow NVIDIA's guidance and what production clusters page on."""

    gpu_temp_c: float = 87.0
    sbe_per_s: float = 3.0
    pcie_replay_per_s: float = 5.0
    nvlink_crc_per_s: float = 5.0
    fb_used_ratio: float = 0.985
    fan_min_rpm: float = 3000.0
    # Power supplies a healthy node reports OK (a redundant pair); set per fleet.
    psu_min_ok: float = 2.0
    # PCIe link width a GPU must train to when it does not report its own maximum.
    pcie_link_width: float = 16.0
    straggler_clock_ratio: float = 0.8
    loss_spike_ratio: float = 1.5
    loss_spike_sigma: float = 6.0
    grad_norm_floor: float = 0.01
    grad_norm_window_s: float = 300.0
    stall_s: float = 90.0
    throughput_ratio: float = 0.9
    # Consecutive reports of new steps below the ratio (a report that repeats the last step is not judged).
    throughput_ticks: int = 3
    hold_s: float = 60.0
    crash_memory_s: float = 300.0
    # A NIC whose kernel "Link down" is followed this soon by "Link up" flapped; it is not a dead link.
    link_flap_s: float = 30.0


# The kernel-log decoder's signatures (vigil/sources/collect/kmsg.py) -> fault type or finding.
KERNEL_FAULTS = {"mlx5_link_down": "link_down", "mlx5_health": "nic_lost", "rnic_gid_error": "rnic_gid_error",
                 "mce": "cpu_mce", "mce_logged": "mce_logged", "fs_readonly": "fs_readonly",
                 "gpu_fallen_off_bus": "gpu_lost",
                 "nvswitch_sxid": "nvswitch_error", "oom_kill": "host_oom", "segfault": "process_crash"}
# The node agent's NVML and sysfs observations that have no metric, by event kind -> fault type. Everything else
# those collectors see (link state and rate, link_downed, PCIe width, row-remap failure) is a metric the
# metric rules judge, so each fact is judged once.
DIRECT_FAULTS = {"gpu_recovery_action": "gpu_recovery_action", "nic_lost": "nic_lost",
                 "rnic_gid_error": "rnic_gid_error"}
# IPMI SEL sensor types (IPMI 2.0 table 42-3, as ipmitool prints them) -> fault type.
SENSOR_FAULTS = {"Power Supply": "psu_failure", "Fan": "fan_failure"}
# References a rule compares against, computed per frame by the detector.
Reference = Literal["none", "nic_rated_gbps", "pcie_max_width"]


@dataclass(frozen=True)
class MetricRule:
    """``condition(values, delta_per_s, reference)`` -> boolean mask over the frame's entities; delta is 0 for
    gauges (the metric catalogue says which), reference is the per-entity rated value named by ``reference``."""

    family: str
    fault_type: str
    metric: str
    describe: str
    condition: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    reference: Reference = "none"

    @property
    def counter(self) -> bool:
        return is_counter(self.metric)

    @property
    def level(self) -> FaultLevel:
        return fault_level(self.fault_type)


def _rules(t: Thresholds) -> list[MetricRule]:
    nan = np.isnan
    return [
        MetricRule("gpu", "gpu_dbe", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "double-bit ECC errors rose",
                   lambda v, d, r: d > 0),
        MetricRule("gpu", "gpu_sbe_storm", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                   f"single-bit ECC errors above {t.sbe_per_s}/s", lambda v, d, r: d > t.sbe_per_s),
        MetricRule("gpu", "gpu_thermal", "DCGM_FI_DEV_GPU_TEMP", f"GPU temperature above {t.gpu_temp_c} C",
                   lambda v, d, r: v > t.gpu_temp_c),
        MetricRule("gpu", "gpu_pcie_replay", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                   f"PCIe replays above {t.pcie_replay_per_s}/s", lambda v, d, r: d > t.pcie_replay_per_s),
        MetricRule("gpu", "gpu_pcie_width_low", "DCGM_FI_DEV_PCIE_LINK_WIDTH",
                   "PCIe link width below the GPU's maximum", lambda v, d, r: v < r, reference="pcie_max_width"),
        MetricRule("gpu", "nvlink_error", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                   f"NVLink CRC flit errors above {t.nvlink_crc_per_s}/s", lambda v, d, r: d > t.nvlink_crc_per_s),
        MetricRule("gpu", "gpu_row_remap_failure", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "row remapping failed",
                   lambda v, d, r: v > 0),
        MetricRule("node", "node_down", "vigil_node_up", "node is down", lambda v, d, r: v == 0),
        MetricRule("node", "psu_failure", "vigil_node_psu_ok", f"fewer than {t.psu_min_ok:.0f} power supplies OK",
                   lambda v, d, r: v < t.psu_min_ok),
        MetricRule("node", "fan_failure", "vigil_node_fan_speed_min_rpm",
                   f"slowest fan below {t.fan_min_rpm:.0f} rpm", lambda v, d, r: v < t.fan_min_rpm),
        MetricRule("node", "fs_readonly", "vigil_node_filesystem_readonly", "a local filesystem is read-only",
                   lambda v, d, r: v > 0),
        MetricRule("node", "kubelet_down", "vigil_node_kubelet_ready", "kubelet is not ready",
                   lambda v, d, r: v == 0),
        MetricRule("nic", "link_down", "vigil_nic_link_up", "NIC link is down", lambda v, d, r: v == 0),
        MetricRule("nic", "nic_speed_low", "vigil_nic_speed_gbps", "NIC speed below its rated speed",
                   lambda v, d, r: (v > 0) & (v < r), reference="nic_rated_gbps"),
        MetricRule("nic", "link_flap", "vigil_nic_link_downed_total", "NIC link flapped", lambda v, d, r: d > 0),
        MetricRule("nic", "nic_symbol_errors", "vigil_nic_symbol_errors_total", "NIC symbol errors",
                   lambda v, d, r: d > 1.0),
        # a metric family that vanished while its host is up: the device is gone or its driver hangs
        MetricRule("gpu", "gpu_metrics_missing", "DCGM_FI_DEV_GPU_UTIL", "GPU reports no metrics while its node is up",
                   lambda v, d, r: nan(v)),
        MetricRule("nic", "nic_lost", "vigil_nic_link_up", "NIC reports no metrics while its node is up",
                   lambda v, d, r: nan(v)),
    ]


def _level_or(name: str, reported: FaultLevel) -> FaultLevel:
    """The catalogue's level of a fault or finding; the source's own level for a name it does not hold."""
    try:
        return fault_level(name)
    except VigilInputError:
        return reported


def _sel_fault(message: str) -> str | None:
    """The fault an asserted IPMI SEL record reports, by its sensor type: ipmitool prints
    ``Power Supply #0x51 | Failure detected | Asserted`` (sensor type first, then the sensor's name or id)."""
    fields = [f.strip() for f in message.split("|")]
    if not fields or fields[-1] != "Asserted":
        return None
    for field in fields:
        for sensor_type, fault in SENSOR_FAULTS.items():
            if field.startswith(sensor_type):
                return fault
    return None


@dataclass
class _JobState:
    last_steps: float = np.nan
    last_progress_ts: float = np.nan
    loss_mean: float = np.nan
    loss_var: float = 0.0
    tokens_base: float = np.nan
    slow_ticks: int = 0
    last_crash_ts: float = -np.inf


class RuleDetector(StreamDetector):
    """The rules as one StreamDetector."""

    name = "rules"

    def __init__(self, topology: Topology, thresholds: Thresholds | None = None) -> None:
        self.t = thresholds or Thresholds()
        self.rules = _rules(self.t)
        self.active: dict[tuple[str, str], Anomaly] = {}
        self.closed: list[Anomaly] = []
        self.unknown_xids = 0
        # kernel link-down lines waiting link_flap_s for a link-up that makes them a flap
        self._link_down_pending: dict[str, Event] = {}
        self._prev: dict[str, tuple[float, np.ndarray, list[str]]] = {}
        self._jobs: dict[str, _JobState] = {}
        self._grad_hist: dict[str, list[tuple[float, float]]] = {}
        self.timeouts = CollectiveTimeouts(topology)
        self.set_topology(topology)

    def set_topology(self, topology: Topology) -> None:
        """Read placement, GPUs' nodes and NICs' rated speeds from a newer topology (a node registered, a job
        started). The running state - open anomalies, the last frame for counter deltas, jobs' baselines -
        stays, so a topology change neither re-opens nor forgets anything."""
        self.topology = topology
        self.timeouts.set_topology(topology)
        self._rank_of_gpu = {gpu: (job.id, r) for job in topology.jobs for r, gpu in enumerate(job.placement)}
        self._job_gpus = {job.entity: list(job.placement) for job in topology.jobs}
        self._node_of: dict[str, str] = {}
        self._nic_rated: dict[str, float] = {}
        for node in topology.nodes:
            for gpu in node.gpus:
                self._node_of[gpu.id] = node.id
            for nic in node.nics:
                self._node_of[nic.id] = node.id
                self._nic_rated[nic.id] = nic.speed_gbps

    def resume(self, anomaly: Anomaly) -> None:
        """Take up an anomaly stored before a restart as open, so the rule that keeps firing extends it
        instead of opening a second one."""
        self.active.setdefault((anomaly.entity, anomaly.fault_type), anomaly)

    # ---------------------------------------------------------------- anomaly bookkeeping

    def _fire(self, ts: float, entity: str, fault_type: str, level: FaultLevel, summary: str,
              kind: Literal["metric", "event", "peer"] = "metric", metric: str | None = None,
              value: float | None = None, opened: list[Anomaly] | None = None,
              context: dict[str, object] | None = None, **attrs: object) -> None:
        key = (entity, fault_type)
        anomaly = self.active.get(key)
        if anomaly is not None:
            anomaly.end = max(anomaly.end, ts)
            return
        evidence = Evidence(kind=kind, entity=entity, ts=ts, summary=summary, metric=metric,
                            value=None if value is None or not np.isfinite(value) else float(value),
                            attrs={**(context or {}), **attrs})
        anomaly = Anomaly(entity=entity, start=ts, end=ts, detector=self.name, fault_type=fault_type, level=level,
                          evidence=[evidence])
        self.active[key] = anomaly
        if opened is not None:
            opened.append(anomaly)

    def _expire(self, ts: float) -> None:
        for key, anomaly in list(self.active.items()):
            if ts - anomaly.end > self.t.hold_s:
                self.closed.append(self.active.pop(key))

    def close(self) -> list[Anomaly]:
        self._judge_link_downs(float("inf"), None)
        self.closed.extend(self.active.values())
        self.active.clear()
        return self.closed

    def _judge_link_downs(self, now: float, opened: list[Anomaly] | None) -> None:
        """A kernel link-down that no link-up followed within link_flap_s is a link down."""
        for entity, event in list(self._link_down_pending.items()):
            if now - event.ts >= self.t.link_flap_s:
                del self._link_down_pending[entity]
                fault = KERNEL_FAULTS["mlx5_link_down"]
                self._fire(event.ts, entity, fault, _level_or(fault, event.level), f"kernel: {event.message[:200]}",
                           kind="event", opened=opened)

    # ---------------------------------------------------------------- the tick

    def update(self, frames: Sequence[MetricFrame], events: Sequence[Event]) -> list[Anomaly]:
        opened: list[Anomaly] = []
        by_family = {f.family: f for f in frames}
        ts = max((f.ts for f in frames), default=max((e.ts for e in events), default=0.0))
        down_nodes = set()
        node_frame = by_family.get("node")
        if node_frame is not None and "vigil_node_up" in node_frame.metrics:
            up = node_frame.column("vigil_node_up")
            down_nodes = {node_frame.entities[int(i)] for i in np.flatnonzero(~(up > 0))}
        for event in events:
            self._event(event, opened)
        self._judge_link_downs(ts, opened)
        self._silent_ranks(ts, events, down_nodes, opened)
        for frame in frames:
            self._metric_rules(frame, down_nodes, opened)
        if "gpu" in by_family:
            self._stragglers(by_family["gpu"], opened)
        if "job" in by_family:
            self._training(by_family["job"], opened)
        for frame in frames:
            self._prev[frame.family] = (frame.ts, frame.values, list(frame.metrics))
        self._expire(ts)
        return opened

    def _reference(self, rule: MetricRule, frame: MetricFrame) -> np.ndarray:
        if rule.reference == "nic_rated_gbps":
            # a NIC outside the topology has no rating to fall short of
            return np.array([self._nic_rated.get(e, np.nan) for e in frame.entities])
        if rule.reference == "pcie_max_width":
            if "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH" in frame.metrics:
                own = frame.column("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH")
                return np.where(np.isnan(own), self.t.pcie_link_width, own)
            return np.full(len(frame.entities), self.t.pcie_link_width)
        return np.zeros(len(frame.entities))

    def _metric_rules(self, frame: MetricFrame, down_nodes: set[str], opened: list[Anomaly]) -> None:
        prev = self._prev.get(frame.family)
        if prev is not None and (prev[1].shape != frame.values.shape or prev[2] != list(frame.metrics)):
            prev = None
        for rule in self.rules:
            if rule.family != frame.family or rule.metric not in frame.metrics:
                continue
            j = frame.metric_index(rule.metric)
            values = frame.values[:, j]
            delta = np.zeros_like(values)
            if rule.counter:
                if prev is None:
                    continue
                dt = max(frame.ts - prev[0], 1e-9)
                # a counter reset (driver reload) reads as a negative delta: not an error burst
                delta = np.where(values >= prev[1][:, j], (values - prev[1][:, j]) / dt, 0.0)
            with np.errstate(invalid="ignore"):
                mask = np.asarray(rule.condition(values, delta, self._reference(rule, frame)), dtype=bool)
            for i in np.flatnonzero(mask):
                entity = frame.entities[int(i)]
                if rule.fault_type in ("gpu_metrics_missing", "nic_lost") and self._node_of.get(entity) in down_nodes:
                    continue
                value = float(delta[i]) if rule.counter else float(values[i])
                self._fire(frame.ts, entity, rule.fault_type, rule.level,
                           f"{rule.describe} ({rule.metric}={value:.4g}{'/s' if rule.counter else ''})",
                           metric=rule.metric, value=value, opened=opened)

    def _stragglers(self, frame: MetricFrame, opened: list[Anomaly]) -> None:
        """Peer difference: a GPU whose SM clock sits well below its job's median while busy."""
        if "DCGM_FI_DEV_SM_CLOCK" not in frame.metrics or "DCGM_FI_DEV_GPU_UTIL" not in frame.metrics:
            return
        clock = frame.column("DCGM_FI_DEV_SM_CLOCK")
        util = frame.column("DCGM_FI_DEV_GPU_UTIL")
        pos = {e: i for i, e in enumerate(frame.entities)}
        for gpus in self._job_gpus.values():
            idx = np.array([pos[g] for g in gpus if g in pos])
            if len(idx) < 4:
                continue
            busy = idx[util[idx] > 50]
            if len(busy) < 4:
                continue
            median = float(np.median(clock[busy]))
            for i in busy[clock[busy] < self.t.straggler_clock_ratio * median]:
                gpu = frame.entities[int(i)]
                job_name, rank = self._rank_of_gpu[gpu]
                self._fire(frame.ts, rank_id(job_name, rank), "straggler", fault_level("straggler"),
                           f"{gpu} SM clock {clock[i]:.0f} MHz vs job median {median:.0f} MHz",
                           kind="peer", metric="DCGM_FI_DEV_SM_CLOCK", value=float(clock[i]), opened=opened,
                           gpu=gpu)

    def _training(self, frame: MetricFrame, opened: list[Anomaly]) -> None:
        t = self.t
        missing = np.full(len(frame.entities), np.nan)
        cols = {m: frame.column(m) if m in frame.metrics else missing for m in family_metrics("job")}
        for i, job in enumerate(frame.entities):
            st = self._jobs.setdefault(job, _JobState())
            steps = float(cols["vigil_job_steps_total"][i])
            step_time = float(cols["vigil_job_step_time_seconds"][i])
            loss = float(cols["vigil_job_loss"][i])
            grad = float(cols["vigil_job_grad_norm"][i])
            tokens = float(cols["vigil_job_tokens_per_second"][i])
            checkpointing = cols["vigil_job_checkpoint_in_progress"][i] > 0
            progressing = np.isfinite(step_time)
            # A frame holds the job's latest report: between two of its steps, and while it is stopped, every
            # tick sees the same step's values again. NaN steps: a source that does not count them.
            stepped = bool(np.isnan(steps) or np.isnan(st.last_steps) or steps != st.last_steps)
            # stall: the step counter stopped, outside a checkpoint save and not after a reported crash
            if stepped or checkpointing:
                st.last_progress_ts = frame.ts
            st.last_steps = steps
            stalled_for = frame.ts - st.last_progress_ts
            if stalled_for >= t.stall_s and frame.ts - st.last_crash_ts > t.crash_memory_s:
                self._fire(frame.ts, job, "job_hang", fault_level("job_hang"),
                           f"no training step completed for {stalled_for:.0f} s (not checkpointing)",
                           metric="vigil_job_steps_total", value=steps, opened=opened)
            if not progressing:
                st.slow_ticks = 0
                continue
            # NaN in a frame is also "never reported": a loss is NaN only for a job that has reported one.
            if (np.isnan(loss) and np.isfinite(st.loss_mean)) or np.isinf(grad):
                self._fire(frame.ts, job, "nan_loss", fault_level("nan_loss"), "training loss is NaN / gradient is inf",
                           metric="vigil_job_loss", value=loss, opened=opened)
            elif np.isfinite(st.loss_mean):
                sigma = max(np.sqrt(st.loss_var), 1e-3 * st.loss_mean)
                if loss > t.loss_spike_ratio * st.loss_mean and loss > st.loss_mean + t.loss_spike_sigma * sigma:
                    self._fire(frame.ts, job, "loss_spike", fault_level("loss_spike"),
                               f"loss {loss:.3f} vs running mean {st.loss_mean:.3f}", metric="vigil_job_loss",
                               value=loss, opened=opened)
                else:
                    diff = loss - st.loss_mean
                    st.loss_mean += 0.1 * diff
                    st.loss_var = 0.9 * (st.loss_var + 0.1 * diff * diff)
            elif np.isfinite(loss):
                st.loss_mean = loss
            if np.isfinite(grad):
                hist = self._grad_hist.setdefault(job, [])
                hist.append((frame.ts, grad))
                while hist and frame.ts - hist[0][0] > t.grad_norm_window_s:
                    hist.pop(0)
                span = hist[-1][0] - hist[0][0]
                avg = float(np.mean([g for _, g in hist]))
                if span >= 0.5 * t.grad_norm_window_s and avg < t.grad_norm_floor:
                    self._fire(frame.ts, job, "vanishing_gradient", fault_level("vanishing_gradient"),
                               f"gradient-norm average over {span:.0f} s is {avg:.4f} < {t.grad_norm_floor}",
                               metric="vigil_job_grad_norm", value=avg, opened=opened)
            if not stepped:
                # The pace of a step already judged: a hung job's last step, repeated every tick, would
                # otherwise count as several slow ticks (and move the baseline) before the hang is reported.
                continue
            # Throughput against the job's own history: tokens/s where the job reports it, else its step rate.
            pace, metric = (tokens, "vigil_job_tokens_per_second") if np.isfinite(tokens) else (
                1.0 / max(step_time, 1e-9), "vigil_job_step_time_seconds")
            if np.isfinite(st.tokens_base) and pace < t.throughput_ratio * st.tokens_base:
                st.slow_ticks += 1
                if st.slow_ticks >= t.throughput_ticks:
                    what = (f"tokens/s {tokens:.0f}" if metric == "vigil_job_tokens_per_second"
                            else f"step time {step_time:.3g} s")
                    self._fire(frame.ts, job, "throughput_drop", fault_level("throughput_drop"),
                               f"{what} is {pace / st.tokens_base:.0%} of the job's baseline pace",
                               metric=metric, value=tokens if metric == "vigil_job_tokens_per_second" else step_time,
                               opened=opened)
            else:
                st.slow_ticks = 0
                st.tokens_base = pace if np.isnan(st.tokens_base) else 0.9 * st.tokens_base + 0.1 * pace

    # ---------------------------------------------------------------- events

    def _silent_ranks(self, ts: float, events: Sequence[Event], down_nodes: set[str], opened: list[Anomaly]) -> None:
        """The one rank its job's collective timeout leaves out is the one the job hangs on
        (vigil/detect/silent_rank.py)."""
        down = down_nodes | {entity for entity, fault in self.active if fault == "node_down"}
        self.timeouts.add(events, down, ts)
        for verdict in self.timeouts.judge(ts):
            self._fire(verdict.ts, verdict.rank, "job_hang", fault_level("job_hang"), verdict.summary, kind="peer",
                       opened=opened, context=verdict.attrs)

    def _event(self, event: Event, opened: list[Anomaly]) -> None:
        kind, attrs = event.kind, event.attrs
        if kind == "xid":
            code = int(attrs.get("xid", -1))
            info = xid_info(code)
            if not info.known:
                self.unknown_xids += 1
                log.warning("unknown Xid %s on %s: treated as CONTACT_SUPPORT (drain)", code, event.entity)
            # The code's own level (NVIDIA's immediate action): codes of one fault differ in urgency (63 vs 64).
            self._fire(event.ts, event.entity, info.fault, info.level,
                       f"Xid {code} {info.mnemonic} ({info.bucket or 'no bucket'}): {event.message[:200]}",
                       kind="event", opened=opened, xid=code)
        elif kind == "kernel" and attrs.get("signature") == "mlx5_link_down":
            self._link_down_pending.setdefault(event.entity, event)
        elif kind == "kernel" and attrs.get("signature") == "mlx5_link_up":
            down = self._link_down_pending.pop(event.entity, None)
            if down is not None:
                self._fire(down.ts, event.entity, "link_flap", fault_level("link_flap"),
                           f"kernel: link down, back up after {event.ts - down.ts:.0f} s: {down.message[:160]}",
                           kind="event", opened=opened)
        elif kind == "kernel" and attrs.get("signature"):
            signature = str(attrs["signature"])
            fault = KERNEL_FAULTS.get(signature, signature)
            self._fire(event.ts, event.entity, fault, _level_or(fault, event.level), f"kernel: {event.message[:200]}",
                       kind="event", opened=opened)
        elif kind in DIRECT_FAULTS:
            fault = DIRECT_FAULTS[kind]
            self._fire(event.ts, event.entity, fault, fault_level(fault), f"{event.source}: {event.message[:200]}",
                       kind="event", opened=opened)
        elif kind == "ipmi_sel" and (sensor_fault := _sel_fault(event.message)) is not None:
            self._fire(event.ts, event.entity, sensor_fault, fault_level(sensor_fault),
                       f"IPMI SEL: {event.message[:200]}", kind="event", opened=opened)
        elif kind == "k8s" and attrs.get("reason") == "NodeNotReady":
            self._fire(event.ts, event.entity, "node_not_ready", fault_level("node_not_ready"), event.message[:200],
                       kind="event", opened=opened)
        elif kind == "job" and attrs.get("reason") == "crashed":
            self._jobs.setdefault(event.entity, _JobState()).last_crash_ts = event.ts
            exit_reason = str(attrs.get("exit_reason", ""))
            where = _where(attrs)
            if "out of memory" in exit_reason.lower() and attrs.get("rank") is not None:
                job_name = event.entity.split("/", 1)[1]
                self._fire(event.ts, rank_id(job_name, int(str(attrs["rank"]))), "gpu_oom", fault_level("gpu_oom"),
                           f"rank {attrs['rank']} died: {exit_reason}", kind="event", opened=opened, context=where)
            else:
                rank = attrs.get("rank")
                entity = event.entity if rank is None else rank_id(event.entity.split("/", 1)[1], int(str(rank)))
                self._fire(event.ts, entity, "job_crash", fault_level("job_crash"),
                           f"job crashed: {exit_reason[:200] or 'no exit reason'}", kind="event", opened=opened,
                           context=where)
        elif kind == "job" and attrs.get("reason") == "hung" and attrs.get("rank") is not None:
            # A launch supervisor's verdict names the rank the job waits on; the stall check on the job's
            # telemetry stays quiet for it, as after a crash (the job has been stopped).
            self._jobs.setdefault(event.entity, _JobState()).last_crash_ts = event.ts
            rank = int(str(attrs["rank"]))
            how = f" ({attrs['hang_kind']})" if attrs.get("hang_kind") else ""
            self._fire(event.ts, rank_id(event.entity.split("/", 1)[1], rank), "job_hang", fault_level("job_hang"),
                       f"rank {rank} hung{how}: {str(attrs.get('exit_reason') or event.message)[:200]}",
                       kind="event", opened=opened, context=_where(attrs))


def _where(attrs: dict[str, object]) -> dict[str, object]:
    """Where a reported rank ran and how it ended, for the evidence."""
    return {k: attrs[k] for k in ("node", "gpu", "exit_code", "signal") if attrs.get(k) is not None}
