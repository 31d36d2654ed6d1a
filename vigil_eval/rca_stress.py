"""RCA on incidents the knowledge base was not written for: AC@1 / AC@3 per subset, development and held-out.

The catalogue evaluation (:mod:`vigil_eval.rca`) injects one fault at a time with the simulator's own records,
so the detector often names the answer and RCA only has to agree. Here every case changes what the knowledge
base's authors assumed, in one way per subset:

- ``concurrent_job``: two faults on two nodes of the same job, overlapping in time; each is scored on the
  incident raised for it, with the other injected fault removed from its ranking.
- ``concurrent_node``: two faults on one node (a GPU fault and a fault on another GPU or a NIC of that node).
- ``xid_family``: the fault's Xid rewritten as another code of the same family, chosen from NVIDIA's Xid
  catalogue by mnemonic and immediate action (:func:`xid_families`), not from the knowledge base's table.
- ``missing_kernel``: no kernel log at all (no Xid, mlx5, mce lines; Xids then come only from dcgm-exporter's
  last-Xid gauge, as the agent reads them on such a node); ``missing_dcgm``: no GPU metrics
  (dcgm-exporter absent); ``missing_rank_logs``: no rank logs (pods gone before their logs were collected).
- ``noisy_node``: the faulty node also writes what healthy nodes write every day - application Xids (13, 31,
  43, 45: the catalogue's RESTART_APP / IGNORE codes) on its GPUs, a NIC that flaps (down, up two seconds
  later) and the kernel's note that corrected machine checks were logged.
- ``lookalike``: faults drawn from groups whose surface symptoms overlap (a lost GPU, a dead host and a
  panicked kernel; a dead link, a lost NIC and a failed switch; slow GPUs, hot GPUs and slow NICs ...).
- ``real_text``: the root rank's log lines and the node's kernel lines of the fault replaced by a real
  failure log of the matching kind from the public corpus (tests/fixtures/logs/real; message text as
  written, timestamps moved to the incident, PCI addresses pointed at the faulty GPU).

Truth is the injected fault (entity, fault type). A case also records whether a rule had already emitted the
exact answer (an anomaly of the rules detector with the truth's entity and fault type), so the share of
cases where RCA only had to agree with a rule is reported beside AC@k.

Split: development cases use ``DEV_SEED`` and the corpus' development logs, held-out cases another seed and
the corpus' held-out logs; weights in :mod:`vigil.diagnose.rca` are chosen on development cases only.
"""

from __future__ import annotations

import csv
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np

from vigil.detect.rules import RuleDetector
from vigil.diagnose.kg import KnowledgeGraph
from vigil.diagnose.peers import PeerDifferenceDetector
from vigil.diagnose.rca import analyze_incident
from vigil.model import Event, LogRecord, VigilInputError, rank_id
from vigil.run.pipeline import run_pipeline
from vigil.sources.sim.faults import CATALOGUE
from vigil.sources.sim.generator import FaultPlan, SimConfig, SimRun, Tick
from vigil_eval.rca import GPUS, MINUTES, NODES, _entity_for, _node_of, detector_only_ranking
from vigil_eval.realcorpus import CORPUS, RealCase, Split, load_cases
from vigil_eval.scoring import score

REPO = Path(__file__).resolve().parents[1]
XID_CATALOGUE = REPO.parent / "shared" / "data" / "xid" / "xid_catalog.csv"
SUBSETS = ("concurrent_job", "concurrent_node", "xid_family", "missing_kernel", "missing_dcgm",
           "missing_rank_logs", "noisy_node", "lookalike", "real_text")
DEV_SEED, HELD_OUT_SEED = 11, 2027

# Faults whose entity lives on one node (GPU, NIC, node, rank): the ones two can overlap on a node or a job.
NODE_FAULTS = ("gpu_dbe", "gpu_xid", "gpu_lost", "gpu_gsp_timeout", "gpu_pcie_width_low", "gpu_thermal",
               "gpu_sbe_storm", "nvlink_error", "gpu_row_remap_failure", "gpu_oom", "link_down", "nic_lost",
               "nic_speed_low", "rnic_gid_error", "psu_failure", "fan_failure", "cpu_mce",
               "node_hardware_failure", "fs_readonly", "kubelet_down", "kernel_panic", "straggler", "gpu_p2p_bw_low")
GPU_FAULTS = tuple(f for f in NODE_FAULTS if f.startswith("gpu_") or f == "nvlink_error")
LOOKALIKE_GROUPS = (
    ("gpu_lost", "node_hardware_failure", "kernel_panic"),
    ("link_down", "nic_lost", "switch_failure", "rnic_gid_error"),
    ("straggler", "gpu_thermal", "nic_speed_low", "gpu_pcie_width_low", "gpu_p2p_bw_low"),
    ("gpu_dbe", "gpu_row_remap_failure", "gpu_sbe_storm"),
    ("gpu_xid", "gpu_gsp_timeout", "gpu_oom"),
    ("job_hang", "link_down", "gpu_lost"),
)
# Real-corpus categories whose root error a fault of this type writes; xid-category logs by the code they carry.
REAL_TEXT_FAULTS = {"cuda_oom": "gpu_oom", "ib_error": "link_down", "gpu_lost": "gpu_lost"}
REAL_XID_FAULTS = {119: "gpu_gsp_timeout", 109: "gpu_xid"}
# What healthy nodes write every day: application Xids the catalogue files under RESTART_APP / IGNORE.
APP_XIDS = {13: "Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Out Of Range Address",
            31: "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_4c000000.",
            43: "Ch 00000008, intr 10000000", 45: "Preemptive Channel Removal"}

Change = Literal["none", "xid", "no_kernel", "no_dcgm", "no_rank_logs", "noise", "real_text"]


@dataclass(frozen=True)
class StressCase:
    index: int
    subset: str
    split: Split
    seed: int
    plans: tuple[FaultPlan, ...]
    truths: tuple[int, ...] = (0,)  # which plans are scored (the rest is what the subset adds)
    xid_swap: tuple[int, int] | None = None
    real_log: str | None = None  # id of a real-corpus case


@dataclass
class TruthResult:
    fault_type: str
    entity: str
    detected: bool
    rank: int | None
    rule_had_answer: bool
    top3: list[tuple[str, str]]
    baseline_rank: int | None = None  # the same measure for detection alone (no graph, no knowledge base)


@dataclass
class StressResult:
    case: StressCase
    truths: list[TruthResult]
    seconds: float


@dataclass
class StressReport:
    results: list[StressResult] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        by_split: dict[str, dict[str, Any]] = {}
        for split in ("development", "held_out"):
            rows = [r for r in self.results if r.case.split == split]
            if not rows:
                continue
            by_subset: dict[str, list[TruthResult]] = defaultdict(list)
            for result in rows:
                by_subset[result.case.subset].extend(result.truths)
            everything = [t for r in rows for t in r.truths]
            by_split[split] = {
                "all": _block(everything),
                "by_subset": {s: _block(by_subset[s]) for s in SUBSETS if s in by_subset},
                "misses": [{"case": r.case.index, "subset": r.case.subset, "truth": [t.entity, t.fault_type],
                            "detected": t.detected, "rank": t.rank, "top3": t.top3}
                           for r in rows for t in r.truths if t.rank != 1][:60],
            }
        return by_split


def _block(items: list[TruthResult]) -> dict[str, Any]:
    n = len(items)
    without_rule = [t for t in items if not t.rule_had_answer]

    def ac(group: list[TruthResult], k: int, baseline: bool = False) -> float | None:
        if not group:
            return None
        ranks = [t.baseline_rank if baseline else t.rank for t in group]
        return round(sum(1 for r in ranks if r is not None and r <= k) / len(group), 4)

    return {"faults": n, "detected": sum(t.detected for t in items), "ac_at_1": ac(items, 1), "ac_at_3": ac(items, 3),
            "baseline_ac_at_1": ac(items, 1, baseline=True), "baseline_ac_at_3": ac(items, 3, baseline=True),
            "rule_had_answer": round(sum(t.rule_had_answer for t in items) / n, 4) if n else None,
            "ac_at_1_without_rule_answer": ac(without_rule, 1), "faults_without_rule_answer": len(without_rule)}


# --------------------------------------------------------------------------- vendor facts the cases use


@lru_cache(maxsize=1)
def xid_families(catalogue: Path = XID_CATALOGUE) -> dict[str, tuple[int, ...]]:
    """Codes of one fault family, read from NVIDIA's Xid catalogue by mnemonic and immediate action:
    uncorrectable memory errors, memory retirement failures, NVLink errors, GSP errors, and the generic device
    faults (RESET_GPU / CONTACT_SUPPORT codes of no other family) - the codes a fault of that type can raise."""
    try:
        rows = list(csv.DictReader(catalogue.open(newline="")))
    except FileNotFoundError:
        raise VigilInputError(f"Xid catalogue {catalogue} does not exist (../shared/data/xid)") from None
    families: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        code, mnemonic, action = int(row["xid"]), row["mnemonic"].upper(), row["immediate_action"].strip()
        if mnemonic in ("ROBUST_CHANNEL_GPU_ECC_DBE", "ROBUST_CHANNEL_CONTAINED_ERROR",
                        "ROBUST_CHANNEL_UNCONTAINED_ERROR", "UNRECOVERABLE_ECC_ERROR_ESCAPE"):
            families["gpu_dbe"].append(code)
        elif mnemonic in ("INFOROM_DRAM_RETIREMENT_FAILURE", "RESOURCE_RETIREMENT_FAILURE"):
            families["gpu_row_remap_failure"].append(code)
        elif (mnemonic.startswith("NVLINK_") or mnemonic == "ALI_TRAINING_FAIL") and action not in ("", "IGNORE"):
            families["nvlink_error"].append(code)
        elif mnemonic.startswith("GSP_"):
            families["gpu_gsp_timeout"].append(code)
        elif action in ("RESET_GPU", "CONTACT_SUPPORT") and not re.search(r"ECC|RETIRE|BUS|SBE|DRAM", mnemonic):
            families["gpu_xid"].append(code)
    return {name: tuple(sorted(codes)) for name, codes in families.items()}


# Xid codes the simulator's renderings write per fault (vigil/sources/sim/effects.py).
SIM_XIDS = {"gpu_dbe": (48,), "gpu_row_remap_failure": (64,), "nvlink_error": (74,), "gpu_gsp_timeout": (119,),
            "gpu_xid": (62, 109)}


# --------------------------------------------------------------------------- cases


def _plan(fault: str, entity: str, start: float, rng: np.random.Generator) -> FaultPlan:
    return FaultPlan(fault, entity, start, float(rng.uniform(10, 14)) * 60.0)


def _node_num(entity: str) -> int | None:
    """The node of a GPU, NIC, node or rank entity of the evaluation cluster; None for wider entities."""
    nodes = _node_of(entity)
    return next(iter(nodes)) if len(nodes) == 1 else None


def _same_node_entity(fault: str, node: int, rng: np.random.Generator, avoid: str) -> str:
    spec = next(s for s in CATALOGUE if s.name == fault)
    for _ in range(32):
        if spec.target == "gpu":
            entity = f"gpu/n{node:03d}/{int(rng.integers(GPUS))}"
        elif spec.target == "nic":
            entity = f"nic/n{node:03d}/mlx5_{int(rng.integers(GPUS))}"
        elif spec.target == "rank":
            entity = rank_id(f"j{node // 8:02d}", (node % 8) * GPUS + int(rng.integers(GPUS)))
        else:
            entity = f"node/n{node:03d}"
        if entity != avoid:
            return entity
    raise VigilInputError(f"no entity for {fault} on node {node} other than {avoid}")


def _real_logs(split: Split) -> dict[str, list[RealCase]]:
    """Real-corpus cases of ``split`` per fault type they are the text of."""
    out: dict[str, list[RealCase]] = defaultdict(list)
    for case in load_cases():
        if case.split != split:
            continue
        fault = REAL_TEXT_FAULTS.get(case.category)
        if case.category == "xid":
            codes = {int(m.group(1)) for m in re.finditer(r"Xid \(PCI:[^)]*\): (\d+),", _read_text(case))}
            fault = next((REAL_XID_FAULTS[c] for c in sorted(codes) if c in REAL_XID_FAULTS), None)
        if fault is not None:
            out[fault].append(case)
    return out


def _read_text(case: RealCase) -> str:
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(case.directory.iterdir()))


def build_stress_cases(per_subset: int, split: Split, seed: int | None = None) -> list[StressCase]:
    """``per_subset`` cases of every subset for one split (development: DEV_SEED, held-out: HELD_OUT_SEED)."""
    if per_subset < 1:
        raise VigilInputError(f"--per-subset must be >= 1, got {per_subset}")
    rng = np.random.default_rng(seed if seed is not None else (DEV_SEED if split == "development" else HELD_OUT_SEED))
    by_name = {spec.name: spec for spec in CATALOGUE}
    families = xid_families()
    real = _real_logs(split)
    cases: list[StressCase] = []

    def start() -> float:
        return float(rng.uniform(12, 16)) * 60.0

    def add(subset: str, plans: tuple[FaultPlan, ...], **extra: Any) -> None:
        cases.append(StressCase(len(cases), subset, split, int(rng.integers(2**31)), plans, **extra))

    for subset in SUBSETS:
        for k in range(per_subset):
            t0 = start()
            if subset == "concurrent_job":
                first, second = rng.choice(NODE_FAULTS, 2, replace=False)
                entity = _entity_for(by_name[str(first)], rng)
                node = _node_num(entity)
                job_nodes = [n for n in range(NODES) if node is not None and n // 8 == node // 8 and n != node]
                other = _same_node_entity(str(second), int(rng.choice(job_nodes)), rng, avoid="")
                add(subset, (_plan(str(first), entity, t0, rng),
                             _plan(str(second), other, t0 + float(rng.uniform(-60, 60)), rng)), truths=(0, 1))
            elif subset == "concurrent_node":
                first = str(rng.choice(GPU_FAULTS))
                second = str(rng.choice([f for f in NODE_FAULTS if f != first and by_name[f].target in ("gpu", "nic")]))
                entity = _entity_for(by_name[first], rng)
                node = _node_num(entity)
                assert node is not None
                other = _same_node_entity(second, node, rng, avoid=entity)
                add(subset, (_plan(first, entity, t0, rng),
                             _plan(second, other, t0 + float(rng.uniform(-60, 60)), rng)), truths=(0, 1))
            elif subset == "xid_family":
                fault = sorted(SIM_XIDS)[k % len(SIM_XIDS)]
                old = SIM_XIDS[fault][0] if fault != "gpu_xid" else 0
                choices = [c for c in families[fault] if c not in SIM_XIDS[fault]]
                new = int(rng.choice(choices))
                add(subset, (_plan(fault, _entity_for(by_name[fault], rng), t0, rng),), xid_swap=(old, new))
            elif subset == "lookalike":
                group = LOOKALIKE_GROUPS[k % len(LOOKALIKE_GROUPS)]
                fault = str(rng.choice(group))
                add(subset, (_plan(fault, _entity_for(by_name[fault], rng), t0, rng),))
            elif subset == "real_text":
                faults = sorted(real)
                if not faults:
                    raise VigilInputError(f"the real-log corpus {CORPUS} has no {split} log a fault type maps to")
                fault = faults[k % len(faults)]
                logs = real[fault]
                log = logs[(k // len(faults)) % len(logs)]
                add(subset, (_plan(fault, _entity_for(by_name[fault], rng), t0, rng),), real_log=log.id)
            else:
                fault = str(rng.choice(NODE_FAULTS + ("job_hang", "switch_failure")))
                add(subset, (_plan(fault, _entity_for(by_name[fault], rng), t0, rng),))
    return cases


# --------------------------------------------------------------------------- running a case


class _Run(SimRun):
    """A simulated run with some of its metric families absent (the exporter that writes them is not there)."""

    def __init__(self, config: SimConfig, without: frozenset[str] = frozenset()) -> None:
        super().__init__(config)
        self.without = without

    def ticks(self) -> Iterator[Tick]:
        for tick in super().ticks():
            if self.without:
                tick = Tick(tick.ts, [f for f in tick.frames if f.family not in self.without], tick.events,
                            tick.kernel_lines)
            yield tick


def _kernel_line(ts: float, message: str) -> str:
    stamp = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")
    return f"kern  :err   : {stamp} {message}"


def _gpu_bus(run: SimRun, gpu: str) -> str:
    _, node, index = gpu.split("/")
    host = next(n for n in run.topology.nodes if n.name == node)
    return host.gpus[int(index)].pci_bus_id.split(":")[1]


def _rank_of_gpu(kg: KnowledgeGraph, gpu: str) -> str | None:
    return next((str(r) for r in kg.graph.successors(gpu) if r in kg.rank_job), None)


def _add_noise(run: SimRun, plan: FaultPlan, rng: np.random.Generator) -> None:
    """What a healthy node writes every day, on the faulty node around the fault's onset."""
    node_num = _node_num(plan.entity)
    if node_num is None:
        return
    node = f"node/n{node_num:03d}"
    host = run.topology.nodes[node_num]
    t0 = run.start_ts + plan.start_s
    for code, message in APP_XIDS.items():
        gpu = host.gpus[int(rng.integers(len(host.gpus)))]
        bus = gpu.pci_bus_id.rsplit(".", 1)[0]
        ts = t0 + float(rng.uniform(-240, 240))
        run.logs.append(LogRecord(ts=ts, entity=node, source="kernel",
                                  line=_kernel_line(ts, f"NVRM: Xid (PCI:{bus}): {code}, pid=51022, name=python, "
                                                        f"{message}")))
    nic = host.nics[int(rng.integers(len(host.nics)))]
    netdev = f"enp{int(nic.pci_bus_id.split(':')[1], 16)}s0np0"
    ts = t0 + float(rng.uniform(-300, 300))
    for dt, state in ((0.0, "Link down"), (2.0, "Link up")):
        run.logs.append(LogRecord(ts=ts + dt, entity=node, source="kernel",
                                  line=_kernel_line(ts + dt, f"mlx5_core {nic.pci_bus_id} {netdev}: {state}")))
    ts = t0 + float(rng.uniform(-300, 300))
    run.logs.append(LogRecord(ts=ts, entity=node, source="kernel",
                              line=_kernel_line(ts, "mce: [Hardware Error]: Machine check events logged")))
    run.logs.sort(key=lambda r: r.ts or 0.0)


_BRACKET_STAMP = re.compile(r"^\s*\[[^\]]*\]\s?")
_PCI = re.compile(r"\b(0000:|00000000:)?([0-9a-fA-F]{2}):00(\.0)?\b")


def _real_text(run: SimRun, kg: KnowledgeGraph, plan: FaultPlan, case: RealCase) -> None:
    """Replace the fault's own rank and kernel lines with the real log's text (same moment, same entities)."""
    t0 = run.start_ts + plan.start_s
    gpu = plan.entity if plan.entity.startswith("gpu/") else None
    if plan.entity.startswith("nic/"):
        _, node_name, nic = plan.entity.split("/")
        gpu = f"gpu/{node_name}/{int(nic.removeprefix('mlx5_'))}"  # rail-aligned: NIC k serves GPU k
    rank = _rank_of_gpu(kg, gpu) if gpu else None
    node_num = _node_num(plan.entity)
    node = f"node/n{node_num:03d}" if node_num is not None else None
    files = {p.name: p.read_text(encoding="utf-8", errors="replace").splitlines() for p in case.directory.iterdir()}
    has_job, has_dmesg = "job.log" in files, "dmesg.log" in files
    window = (t0 - 1.0, t0 + 30.0)

    def own(record: LogRecord) -> bool:
        in_window = record.ts is not None and window[0] <= record.ts <= window[1]
        if has_job and rank is not None and record.entity == rank and record.source == "rank":
            return in_window
        return has_dmesg and node is not None and record.entity == node and record.source == "kernel" and in_window

    run.logs[:] = [r for r in run.logs if not own(r)]
    bus = _gpu_bus(run, gpu) if gpu else None
    if has_job and rank is not None:
        for k, line in enumerate(files["job.log"]):
            run.logs.append(LogRecord(ts=t0 + 1.0 + 0.001 * k, entity=rank, source="rank", line=line))
    if has_dmesg and node is not None:
        for k, line in enumerate(files["dmesg.log"]):
            message = _BRACKET_STAMP.sub("", line).strip()
            if bus is not None:
                message = _PCI.sub(lambda m: f"{m.group(1) or ''}{bus}:00{m.group(3) or ''}", message)
            ts = t0 + 0.001 * k
            run.logs.append(LogRecord(ts=ts, entity=node, source="kernel", line=_kernel_line(ts, message)))
    root_text = next(iter(files.get(case.root_file, [])[case.root_line - 1:case.root_line]), "")
    for k, event in enumerate(run.events):
        if event.kind == "job" and event.attrs.get("reason") == "crashed" and event.attrs.get("rank") is not None \
                and window[0] <= event.ts <= window[1] + 10.0:
            attrs = {**event.attrs, "exit_reason": root_text[:500]}
            run.events[k] = Event(ts=event.ts, entity=event.entity, kind=event.kind, source=event.source,
                                  message=f"job crashed: {root_text[:300]}", attrs=attrs)
    run.logs.sort(key=lambda r: r.ts or 0.0)


def _prepare(case: StressCase, kg_cache: dict[str, KnowledgeGraph]) -> tuple[SimRun, KnowledgeGraph]:
    without = frozenset({"gpu"}) if case.subset == "missing_dcgm" else frozenset()
    config = SimConfig(nodes=NODES, gpus=GPUS, minutes=MINUTES, seed=case.seed, nodes_per_switch=4, job_nodes=8,
                       plans=case.plans)
    run = _Run(config, without)
    shape = run.topology.model_dump_json()
    kg = kg_cache.get(shape)
    if kg is None:
        kg = kg_cache[shape] = KnowledgeGraph.build(run.topology)
    rng = np.random.default_rng(case.seed + 1)
    if case.xid_swap is not None:
        old, new = case.xid_swap
        for code in ([old] if old else list(SIM_XIDS["gpu_xid"])):
            run.relabel_xid(code, new)
    if case.subset == "missing_kernel":
        run.logs[:] = [r for r in run.logs if r.source != "kernel"]
    if case.subset == "missing_rank_logs":
        run.logs[:] = [r for r in run.logs if r.source != "rank"]
    if case.subset == "noisy_node":
        _add_noise(run, case.plans[0], rng)
    if case.real_log is not None:
        real = next(c for c in load_cases() if c.id == case.real_log)
        _real_text(run, kg, case.plans[0], real)
    return run, kg


def run_stress_case(case: StressCase, kg_cache: dict[str, KnowledgeGraph] | None = None) -> StressResult:
    """Simulate, change what the subset changes, detect, group and rank; score every truth of the case."""
    started = time.perf_counter()
    cache = kg_cache if kg_cache is not None else {}
    run, kg = _prepare(case, cache)
    # without a kernel log the agent reads Xids from dcgm-exporter's last-Xid gauge (vigil.sources.collect.agent)
    result = run_pipeline(run, detectors=[RuleDetector(run.topology), PeerDifferenceDetector(run.topology)],
                          xid_from_gpu_gauge=case.subset == "missing_kernel")
    anomalies = result.anomalies + list(result.observations)
    matches = score(result.incidents, run.ground_truth, run.topology).matches
    injected = {(p.entity, p.fault_type) for p in case.plans}
    truths = []
    for index in case.truths:
        plan = case.plans[index]
        key = (plan.entity, plan.fault_type)
        rule_had = any(a.detector == RuleDetector.name and (a.entity, a.fault_type) == key for a in result.anomalies)
        match = next((m for m in matches if (m.entity, m.fault_type) == key and m.incident_id), None)
        incident = next((i for i in result.incidents if match is not None and i.id == match.incident_id), None)
        if incident is None:
            truths.append(TruthResult(plan.fault_type, plan.entity, False, None, rule_had, []))
            continue
        ranking = analyze_incident(kg, incident, anomalies, result.events, run.logs).top(10)
        # another injected fault ranked above this one is not a miss: it is also a root of the incident
        ranking = [c for c in ranking if c == key or c not in injected]
        rank = ranking.index(key) + 1 if key in ranking else None
        baseline = [c for c in detector_only_ranking(incident, anomalies) if c == key or c not in injected]
        baseline_rank = baseline.index(key) + 1 if key in baseline else None
        truths.append(TruthResult(plan.fault_type, plan.entity, True, rank, rule_had, ranking[:3], baseline_rank))
    return StressResult(case, truths, time.perf_counter() - started)


def evaluate_stress(per_subset: int, splits: tuple[Split, ...] = ("development", "held_out"),
                    progress: Callable[[int, int], None] | None = None) -> StressReport:
    cases = [c for split in splits for c in build_stress_cases(per_subset, split)]
    report = StressReport()
    cache: dict[str, KnowledgeGraph] = {}
    started = time.perf_counter()
    for done, case in enumerate(cases, start=1):
        report.results.append(run_stress_case(case, cache))
        if progress is not None:
            progress(done, len(cases))
    report.seconds = time.perf_counter() - started
    return report
