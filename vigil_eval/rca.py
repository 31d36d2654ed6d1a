"""Root cause evaluation on simulated incidents: AC@1 / AC@3 as RCAEval defines them.

Each case is one simulated run (the lead's simulator, an explicit fault plan) that goes through the full path
a real deployment runs: metrics, events and logs -> rules detector -> incident grouping -> RCA ranking.
The case's incident is the one detection raised for the injected fault (the simulator's ground-truth
matcher); the ranking never sees the ground truth. A case scores at AC@k when the injected (entity, fault
type) is among the top k causes; a fault that detection missed scores 0 at every k.

Case kinds: ``single`` (one fault of any type), ``cascade`` (a leaf switch failing: every node below loses
its links, jobs hang), ``hang`` (a rank or a link stops a job), ``crash`` (a device or host fault kills a
job), ``noisy`` (a fault plus an unrelated degradation elsewhere at the same time).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vigil.detect.rules import RuleDetector
from vigil.diagnose.kg import KnowledgeGraph
from vigil.diagnose.peers import PeerDifferenceDetector
from vigil.diagnose.rca import analyze_incident
from vigil.model import Anomaly, Incident, VigilInputError, rank_id
from vigil.run.pipeline import run_pipeline
from vigil.sources.sim.faults import CATALOGUE, FaultSpec
from vigil.sources.sim.generator import FaultPlan, SimConfig, simulate
from vigil_eval.scoring import score

CASE_KINDS = ("single", "cascade", "hang", "crash", "noisy")
KIND_SHARE = {"single": 0.45, "cascade": 0.1, "hang": 0.15, "crash": 0.15, "noisy": 0.15}
HANG_FAULTS = ("job_hang", "link_down")
CRASH_FAULTS = ("gpu_dbe", "gpu_xid", "gpu_lost", "gpu_gsp_timeout", "gpu_row_remap_failure", "nic_lost",
                "node_hardware_failure", "kernel_panic", "gpu_oom")
NOISE_FAULTS = ("gpu_thermal", "fan_failure", "nic_speed_low", "gpu_sbe_storm", "psu_failure", "loss_spike")
NODES, GPUS, MINUTES = 16, 8, 36.0


@dataclass
class EvalCase:
    index: int
    kind: str
    seed: int
    plans: tuple[FaultPlan, ...]

    @property
    def truth(self) -> FaultPlan:
        return self.plans[0]


@dataclass
class CaseResult:
    case: EvalCase
    detected: bool
    rank: int | None  # 1-based position of the truth in the ranking, None when absent
    top3: list[tuple[str, str]]
    rca_seconds: float
    incident_id: str | None = None
    baseline_rank: int | None = None  # the same measure for the detector-only ranking
    anomalies_only_rank: int | None = None  # RCA without the raw events and log lines (ablation)
    half_logs_rank: int | None = None  # RCA when half of the log lines were lost (robustness)


@dataclass
class EvalReport:
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        def block(items: list[CaseResult]) -> dict[str, Any]:
            n = len(items)
            return {
                "cases": n,
                "detected": sum(r.detected for r in items),
                "ac_at_1": _ac(items, 1, "rank"),
                "ac_at_3": _ac(items, 3, "rank"),
            }

        by_fault: dict[str, list[CaseResult]] = defaultdict(list)
        by_kind: dict[str, list[CaseResult]] = defaultdict(list)
        for result in self.results:
            by_fault[result.case.truth.fault_type].append(result)
            by_kind[result.case.kind].append(result)
        overall = block(self.results)
        seconds = [r.rca_seconds for r in self.results if r.detected]
        visible = [r for r in self.results if _visible(r.case.truth.fault_type)]
        return {
            "cases": overall["cases"],
            "ac_at_1": overall["ac_at_1"],
            "ac_at_3": overall["ac_at_3"],
            "detected": overall["detected"],
            "visible_to_rules": block(visible),
            "baseline_detector_only": {"ac_at_1": _ac(self.results, 1, "baseline_rank"),
                                       "ac_at_3": _ac(self.results, 3, "baseline_rank")},
            "ablation_anomalies_only": {"ac_at_1": _ac(self.results, 1, "anomalies_only_rank"),
                                        "ac_at_3": _ac(self.results, 3, "anomalies_only_rank")},
            "robustness_half_logs_lost": {"ac_at_1": _ac(self.results, 1, "half_logs_rank"),
                                          "ac_at_3": _ac(self.results, 3, "half_logs_rank")},
            "by_fault": {name: block(items) for name, items in sorted(by_fault.items())},
            "by_kind": {name: block(items) for name, items in sorted(by_kind.items())},
            "rca_seconds_mean": round(float(np.mean(seconds)), 4) if seconds else None,
            "rca_seconds_max": round(float(np.max(seconds)), 4) if seconds else None,
            "misses": [{"case": r.case.index, "kind": r.case.kind, "truth": [r.case.truth.entity,
                                                                              r.case.truth.fault_type],
                        "detected": r.detected, "top3": r.top3} for r in self.results if r.rank != 1][:50],
        }


def _ac(items: list[CaseResult], k: int, attr: str) -> float:
    if not items:
        return 0.0
    hits = sum(1 for r in items if (rank := getattr(r, attr)) is not None and rank <= k)
    return round(hits / len(items), 4)


def detector_only_ranking(incident: Incident, anomalies: list[Anomaly]) -> list[tuple[str, str]]:
    """The baseline: what detection alone says - the incident's scope with its fault types in order, then
    its anomalies by level and score (no graph, no knowledge base)."""
    ranking = [(incident.scope, fault) for fault in incident.fault_types]
    own = sorted((a for a in anomalies if a.id in set(incident.anomalies)), key=lambda a: (-a.level, -a.score))
    ranking += [(a.entity, a.fault_type) for a in own]
    return list(dict.fromkeys(ranking))


def _visible(fault_type: str) -> bool:
    return next(spec.visible_to_rules for spec in CATALOGUE if spec.name == fault_type)


def _entity_for(spec: FaultSpec, rng: np.random.Generator, exclude_nodes: frozenset[int] | set[int] = frozenset(),
                ) -> str:
    """A random entity of the fault's kind in the fixed evaluation cluster (16 nodes x 8 GPUs, 4 per leaf,
    two 8-node jobs), avoiding ``exclude_nodes``."""
    nodes = [n for n in range(NODES) if n not in exclude_nodes]
    node = int(rng.choice(nodes))
    name = f"n{node:03d}"
    if spec.target == "gpu":
        return f"gpu/{name}/{int(rng.integers(GPUS))}"
    if spec.target == "nic":
        return f"nic/{name}/mlx5_{int(rng.integers(GPUS))}"
    if spec.target == "node":
        return f"node/{name}"
    if spec.target == "switch":
        return f"switch/leaf{node // 4:02d}"
    job = node // 8
    if spec.target == "job":
        return f"job/j{job:02d}"
    return rank_id(f"j{job:02d}", (node % 8) * GPUS + int(rng.integers(GPUS)))


def _node_of(entity: str) -> set[int]:
    parts = entity.split("/")
    if parts[0] in ("gpu", "nic", "node"):
        return {int(parts[1][1:])}
    if parts[0] == "switch":
        leaf = int(parts[1][4:])
        return set(range(leaf * 4, leaf * 4 + 4))
    if parts[0] == "job" and len(parts) == 4:
        return {int(parts[1][1:]) * 8 + int(parts[3]) // GPUS}
    if parts[0] == "job":
        return set(range(int(parts[1][1:]) * 8, int(parts[1][1:]) * 8 + 8))
    return set()


def build_cases(n: int, seed: int) -> list[EvalCase]:
    """``n`` cases in the mix of KIND_SHARE; single faults cycle through the whole catalogue."""
    if n < 1:
        raise VigilInputError(f"--cases must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    by_name = {spec.name: spec for spec in CATALOGUE}
    counts = {kind: int(round(share * n)) for kind, share in KIND_SHARE.items()}
    counts["single"] += n - sum(counts.values())
    kinds = [kind for kind, count in counts.items() for _ in range(max(0, count))][:n]
    rng.shuffle(kinds)
    singles = [spec.name for spec in CATALOGUE]
    cases = []
    single_count = 0
    for index, kind in enumerate(kinds):
        if kind == "single":
            # cycle through the catalogue so every fault type is evaluated
            fault = singles[single_count % len(singles)]
            single_count += 1
        elif kind == "cascade":
            fault = "switch_failure"
        elif kind == "hang":
            fault = HANG_FAULTS[int(rng.integers(len(HANG_FAULTS)))]
        elif kind == "crash":
            fault = CRASH_FAULTS[int(rng.integers(len(CRASH_FAULTS)))]
        else:
            fault = singles[int(rng.integers(len(singles)))]
        spec = by_name[fault]
        entity = _entity_for(spec, rng)
        start = float(rng.uniform(12, 16)) * 60.0
        plans = [FaultPlan(fault, entity, start, float(rng.uniform(10, 14)) * 60.0)]
        if kind == "noisy":
            noise = by_name[NOISE_FAULTS[int(rng.integers(len(NOISE_FAULTS)))]]
            # unrelated: on the nodes of the other job (so another switch, other ranks)
            related = {n for n in range(NODES) if n // 8 in {m // 8 for m in _node_of(entity)}}
            noise_entity = _entity_for(noise, rng, exclude_nodes=related)
            if not (_node_of(noise_entity) & related):
                plans.append(FaultPlan(noise.name, noise_entity, start + float(rng.uniform(-120, 120)), 600.0))
        cases.append(EvalCase(index, kind, int(rng.integers(2**31)), tuple(plans)))
    return cases


def run_case(case: EvalCase, kg_cache: dict[str, KnowledgeGraph] | None = None) -> CaseResult:
    """Simulate, detect, group and rank one case."""
    config = SimConfig(nodes=NODES, gpus=GPUS, minutes=MINUTES, seed=case.seed, nodes_per_switch=4, job_nodes=8,
                       plans=case.plans)
    run = simulate(config)
    cache = kg_cache if kg_cache is not None else {}
    shape = run.topology.model_dump_json()
    kg = cache.get(shape)
    if kg is None:
        kg = cache[shape] = KnowledgeGraph.build(run.topology)
    result = run_pipeline(run, detectors=[RuleDetector(run.topology), PeerDifferenceDetector(run.topology)])
    truth = case.truth
    match = next((m for m in score(result.incidents, run.ground_truth, run.topology).matches
                  if m.fault_type == truth.fault_type and m.entity == truth.entity), None)
    incident = next((i for i in result.incidents if match and i.id == match.incident_id), None)
    if incident is None:
        return CaseResult(case, False, None, [], 0.0)
    anomalies = result.anomalies + list(result.observations)
    rca = analyze_incident(kg, incident, anomalies, result.events, run.logs)
    key = (truth.entity, truth.fault_type)
    ranking = rca.top(10)
    rank = ranking.index(key) + 1 if key in ranking else None
    baseline = detector_only_ranking(incident, anomalies)
    baseline_rank = baseline.index(key) + 1 if key in baseline else None
    blind = analyze_incident(kg, incident, anomalies).top(10)
    blind_rank = blind.index(key) + 1 if key in blind else None
    keep = np.random.default_rng(case.seed).random(len(run.logs)) >= 0.5
    kept = [record for record, kept_line in zip(run.logs, keep, strict=True) if kept_line]
    lossy = analyze_incident(kg, incident, anomalies, result.events, kept).top(10)
    lossy_rank = lossy.index(key) + 1 if key in lossy else None
    return CaseResult(case, True, rank, ranking[:3], rca.seconds, incident.id, baseline_rank, blind_rank,
                      lossy_rank)


def evaluate(n: int = 300, seed: int = 7, progress: Callable[[int, int], None] | None = None) -> EvalReport:
    report = EvalReport()
    cache: dict[str, KnowledgeGraph] = {}
    cases = build_cases(n, seed)
    started = time.perf_counter()
    for done, case in enumerate(cases, start=1):
        report.results.append(run_case(case, cache))
        if progress is not None:
            progress(done, len(cases))
    report.seconds = time.perf_counter() - started
    return report
