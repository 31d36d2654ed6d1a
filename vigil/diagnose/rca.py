"""Root cause ranking: candidates (entity x fault type) scored from all of an incident's evidence.

1. Evidence -> observations: every anomaly (rules, learned detectors), Xid event, log line matching a
   signature, crash, hang diagnosis and peer difference becomes a ``symptom`` on an entity
   (``xid:79`` on ``gpu/n03/5``, ``log:nccl_timeout`` on ``job/j0/rank/17`` ...).
2. Candidates: every entity whose fault can show at an observed entity (a reverse walk of the knowledge
   graph's impact edges: a rank's symptoms lead to its GPU, node, NICs, leaf switch, rack) times the fault
   types the knowledge base allows on that kind of entity.
3. Score of a candidate (v, f), a log-likelihood in the style of a noisy-OR explanation:

       score = 0.3 * log P(f)  +  sum over symptoms s of  W_s * log(eps + L(s | f) * coverage_s(v))
               + spread penalty + 0.05 * log personalised-PageRank(v)

   ``coverage_s(v)`` is the weighted share of the observations of s that v reaches through the graph
   (strength decays per hop; a rank's fault explains its job peers' collective symptoms at PEER_IMPACT).
   Symptoms count once each, however many ranks repeat them, so a job-wide NCCL timeout does not drown
   a single Xid. A fault that hits every child of its entity (a switch) is penalised when only a few of
   the children show anything - and preferred when several do: that is the topology reasoning.
4. Each cause is explained by the symptoms that moved its score and the evidence refs behind them.
"""

from __future__ import annotations

import heapq
import math
import re
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from vigil.detect.silent_rank import silent_ranks
from vigil.diagnose.hang import HangDiagnosis
from vigil.diagnose.kb import KnowledgeBase
from vigil.diagnose.kg import PEER_IMPACT, KnowledgeGraph
from vigil.model import Anomaly, Cause, Event, Evidence, Incident, LogRecord, entity_kind, rank_id

EPSILON = 0.02
PRIOR_WEIGHT = 0.3
PAGERANK_WEIGHT = 0.05
MIN_REACH = 0.25
# Symptoms every rank of a stalled job shows, whatever the cause: weighted down, spread to peers.
COLLECTIVE_SYMPTOMS = frozenset({
    "hang", "crash", "log:nccl_timeout", "log:watchdog_timeout", "log:nccl_net_error",
    "log:nccl_unhandled_system_error", "anomaly:job_hang", "anomaly:job_crash", "anomaly:throughput_drop",
    "metric:vigil_job_step_time_seconds", "metric:vigil_job_tokens_per_second", "peer:step_time",
})
GENERIC_WEIGHT = 0.5
# Explaining away: below the first cause, a candidate's gain on a symptom an already-ranked cause explains counts
# only (1 - EXPLAIN_AWAY) as much, so the next causes are other roots rather than other names for the first.
# Chosen on the development split of the stress evaluation (vigil_eval.rca_stress, docs/benchmarks.md).
EXPLAIN_AWAY = 1.0
_XID_IN_TEXT = re.compile(r"Xid \(PCI:[0-9A-Fa-f:.]+\): (\d+),")


@dataclass
class Observation:
    """One symptom seen on one entity, with the evidence it came from."""

    symptom: str
    entity: str
    weight: float
    ref: str
    ts: float
    summary: str


@dataclass
class RankedCause:
    entity: str
    fault_type: str
    score: float
    probability: float
    contributions: list[tuple[str, float]]
    evidence_refs: list[str]

    def explanation(self, kb: KnowledgeBase) -> str:
        fault = kb.faults[self.fault_type]
        moved = ", ".join(f"{s} ({c:+.2f})" for s, c in self.contributions[:4])
        return f"{fault.title} on {self.entity}; evidence that moved it: {moved or 'prior only'}"

    def to_cause(self, kb: KnowledgeBase) -> Cause:
        return Cause(entity=self.entity, fault_type=self.fault_type, score=round(self.probability, 4),
                     explanation=self.explanation(kb), evidence_refs=self.evidence_refs[:20])


@dataclass
class RcaResult:
    incident_id: str
    causes: list[RankedCause]
    observations: list[Observation]
    evidence: list[Evidence]
    seconds: float
    candidates: int = 0
    notes: list[str] = field(default_factory=list)

    def top(self, k: int = 3) -> list[tuple[str, str]]:
        return [(c.entity, c.fault_type) for c in self.causes[:k]]


# --------------------------------------------------------------------------- evidence -> observations


def exit_signal(attrs: Mapping[str, object]) -> str | None:
    """The signal that ended a rank as its launcher reported it (``signal``, or a negative ``exit_code``)."""
    name = attrs.get("signal")
    if isinstance(name, str) and name:
        return name
    code = attrs.get("exit_code")
    if isinstance(code, int) and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return None
    return None


def _entity_in_graph(kg: KnowledgeGraph, entity: str) -> str | None:
    if entity in kg:
        return entity
    return None


def observations_from(
    kg: KnowledgeGraph,
    incident: Incident,
    anomalies: Sequence[Anomaly] = (),
    events: Sequence[Event] = (),
    logs: Sequence[LogRecord] = (),
    hang_culprits: Mapping[str, float] | None = None,
) -> tuple[list[Observation], list[Evidence]]:
    """Turn every kind of evidence into symptoms on entities; also return the Evidence records cited."""
    kb = kg.kb
    # A rank's log line arrives as the event its decoder made (vigil.sources.collect.ranklog, live), as the
    # stored line, or as both: it is read once, as a line.
    stored = {(r.entity, r.ts, r.line) for r in logs if r.source == "rank"}
    logs = [*logs, *(LogRecord(ts=e.ts, entity=e.entity, source="rank", line=e.message) for e in events
                     if e.kind == "rank_log" and (e.entity, e.ts, e.message) not in stored)]
    events = [e for e in events if e.kind != "rank_log"]
    observations: list[Observation] = []
    evidence: list[Evidence] = []

    seen: set[tuple[str, str, str]] = set()

    def add(symptom: str, entity: str, weight: float, ev: Evidence) -> None:
        if _entity_in_graph(kg, entity) is None or (symptom, entity, ev.ref) in seen:
            return
        if not (kb.faults_for_symptom(symptom) or symptom in COLLECTIVE_SYMPTOMS):
            return
        seen.add((symptom, entity, ev.ref))
        observations.append(Observation(symptom, entity, weight, ev.ref, ev.ts, ev.summary[:300]))

    def from_evidence(ev: Evidence, weight: float) -> None:
        attrs = ev.attrs or {}
        if "xid" in attrs:
            add(f"xid:{attrs['xid']}", ev.entity, weight, ev)
        if ev.kind == "hang":
            add("hang", ev.entity, weight, ev)
        if ev.kind == "peer" and ev.metric:
            add(f"peer:{attrs.get('signal', ev.metric)}", ev.entity, weight, ev)
        if ev.kind == "metric" and ev.metric:
            add(f"metric:{ev.metric}", ev.entity, weight, ev)
        if ev.kind in ("log", "event"):
            for signature in kb.match_log(ev.summary):
                add(signature.symptom, ev.entity, weight, ev)
        if isinstance(attrs.get("fault_type"), str):
            add(f"anomaly:{attrs['fault_type']}", ev.entity, weight, ev)
        if (ended_by := exit_signal(attrs)) is not None:
            add(f"signal:{ended_by}", ev.entity, weight, ev)

    for anomaly in anomalies:
        weight = min(1.0, max(0.1, float(anomaly.score))) * (0.6 + 0.1 * int(anomaly.level))
        summary = f"{anomaly.detector}: {anomaly.fault_type} on {anomaly.entity}"
        ev = Evidence(ref=anomaly.id, kind="detector", entity=anomaly.entity, ts=anomaly.start, summary=summary,
                      attrs={"detector": anomaly.detector, "fault_type": anomaly.fault_type})
        evidence.append(ev)
        if anomaly.fault_type in kb.faults or anomaly.fault_type in kb.findings:
            add(f"anomaly:{anomaly.fault_type}", anomaly.entity, weight, ev)
        for item in anomaly.evidence:
            evidence.append(item)
            from_evidence(item, weight)
    for item in incident.evidence:
        evidence.append(item)
        from_evidence(item, 1.0)

    for event in events:
        xid = event.attrs.get("xid")
        if xid is None:
            match = _XID_IN_TEXT.search(event.message)
            xid = int(match.group(1)) if match else None
        signatures = kb.match_log(event.message)
        crashed = event.kind == "job" and event.attrs.get("reason") == "crashed"
        if xid is None and not signatures and not crashed:
            continue  # most events of the footprint are none of these: no Evidence (and id) is made for them
        ev = Evidence(kind="event", entity=event.entity, ts=event.ts, summary=f"{event.kind}: {event.message}"[:4096],
                      attrs={k: v for k, v in event.attrs.items() if isinstance(v, str | int | float)})
        evidence.append(ev)
        if xid is not None:
            level = kb.xids.get(int(xid))
            weight = 1.0 if level is None or int(level.level) >= 2 else 0.4
            add(f"xid:{int(xid)}", event.entity, weight, ev)
        for signature in signatures:
            add(signature.symptom, event.entity, 0.9, ev)
        if crashed:
            rank = event.attrs.get("rank")
            target = f"{event.entity}/rank/{rank}" if isinstance(rank, int) else event.entity
            add("crash", target, 0.5, ev)
            if (ended_by := exit_signal(event.attrs)) is not None:
                add(f"signal:{ended_by}", target, 0.5, ev)

    # A kernel line the node's decoder already turned into an event names its GPU or NIC there; seen again as
    # a line of the node it would let every device of the node explain it.
    decoded: dict[float, list[str]] = defaultdict(list)
    for event in events:
        if event.source == "kernel" and event.message:
            decoded[round(event.ts, 3)].append(event.message)
    for record in logs:
        if record.source == "kernel" and record.ts is not None and any(
                message in record.line for message in decoded.get(round(record.ts, 3), ())):
            continue
        signatures = kb.match_log(record.line)
        if not signatures:
            continue
        ev = Evidence(kind="log", entity=record.entity, ts=record.ts or incident.start,
                      summary=record.line[:500], attrs={"source": record.source})
        evidence.append(ev)
        for signature in signatures:
            add(signature.symptom, record.entity, 0.8, ev)

    observations += _odd_ranks(kg, observations, evidence)
    for rank, confidence in (hang_culprits or {}).items():
        ev = Evidence(kind="hang", entity=rank, ts=incident.start,
                      summary=f"hang diagnosis: {rank} is the culprit (confidence {confidence:.2f})")
        evidence.append(ev)
        add("hang", rank, 2.0 * float(confidence), ev)
        add("peer:stack", rank, float(confidence), ev)
    return observations, evidence


# A job-wide error every rank but one reports points at the one that does not: it is stuck elsewhere
# (watchdog timeout) or it died first (the others then see "remote process exited").
# The share and world size a job-wide error needs are those of the live detector (vigil/detect/silent_rank.py).
ODD_RANK_SYMPTOMS = {"log:nccl_timeout": "peer:silent_rank", "log:watchdog_timeout": "peer:silent_rank",
                     "log:nccl_net_error": "peer:crash_origin"}
ODD_RANK_MAX = 2


def _odd_ranks(kg: KnowledgeGraph, observations: Sequence[Observation], evidence: list[Evidence],
               ) -> list[Observation]:
    """Peer difference over a job's ranks: the few ranks missing an error nearly all their peers report."""
    seen: dict[tuple[str, str], set[str]] = defaultdict(set)
    first_ts: dict[tuple[str, str], float] = {}
    for obs in observations:
        job = kg.rank_job.get(obs.entity)
        if job is not None and obs.symptom in ODD_RANK_SYMPTOMS:
            key = (job, obs.symptom)
            seen[key].add(obs.entity)
            first_ts[key] = min(first_ts.get(key, obs.ts), obs.ts)
    found = []
    for (job, symptom), ranks in seen.items():
        world = kg.job_ranks.get(job, [])
        missing = silent_ranks(world, ranks, max_silent=ODD_RANK_MAX)
        if not missing:
            continue
        peer_symptom = ODD_RANK_SYMPTOMS[symptom]
        for rank in missing:
            ev = Evidence(kind="peer", entity=rank, ts=first_ts[(job, symptom)],
                          summary=f"{len(ranks)} of {len(world)} ranks of {job} report {symptom}; {rank} does not",
                          attrs={"signal": peer_symptom.split(":", 1)[1]})
            evidence.append(ev)
            found.append(Observation(peer_symptom, rank, 1.0, ev.ref, ev.ts, ev.summary))
    return found


def culprits_from_hang(diagnosis: HangDiagnosis, job: str | None = None) -> dict[str, float]:
    """Hang diagnosis (``vigil launch`` / ``vigil diagnose PATH``) -> culprit rank ids with a confidence that
    splits over the culprits; ``job`` is the job id the ranks belong to (default: the diagnosis' job)."""
    name = (job or diagnosis.job).removeprefix("job/")
    ranks = sorted(set(diagnosis.culprit_ranks))
    return {rank_id(name, r): 1.0 / len(ranks) for r in ranks} if ranks else {}


# --------------------------------------------------------------------------- ranking


def _softmax(scores: Sequence[float]) -> list[float]:
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def rank_observations(kg: KnowledgeGraph, observations: Sequence[Observation], top_k: int = 10,
                      admissible: set[str] | None = None) -> tuple[list[RankedCause], int]:
    """Score every candidate (entity, fault) against the observations; best first. ``admissible`` (when given
    and not empty) limits the candidates to those entities."""
    kb = kg.kb
    if not observations:
        return [], 0
    groups: dict[str, list[Observation]] = defaultdict(list)
    for obs in observations:
        groups[obs.symptom].append(obs)
    group_total = {s: sum(o.weight for o in items) for s, items in groups.items()}
    importance = {
        s: min(1.5, max(o.weight for o in items)) * (GENERIC_WEIGHT if s in COLLECTIVE_SYMPTOMS else 1.0)
        for s, items in groups.items()
    }

    reach_cache: dict[str, dict[str, float]] = {}
    # coverage[s][v]: weighted share of symptom s that entity v reaches directly.
    coverage: dict[str, dict[str, float]] = {s: defaultdict(float) for s in groups}
    job_weight: dict[str, dict[str, float]] = {s: defaultdict(float) for s in groups}
    for symptom, items in groups.items():
        covered = coverage[symptom]
        for obs in items:
            reach = reach_cache.get(obs.entity)
            if reach is None:
                reach = {v: k for v, k in kg.causes_of(obs.entity).items() if k >= MIN_REACH}
                reach_cache[obs.entity] = reach
            weight = obs.weight
            for entity, strength in reach.items():
                covered[entity] += weight * strength
            job = kg.rank_job.get(obs.entity)
            if job is not None:
                job_weight[symptom][job] += obs.weight

    def cited(causes: Iterable[tuple[str, list[tuple[str, float]]]]) -> dict[tuple[str, str], list[str]]:
        """(symptom, entity) -> the first five observations of the symptom that the entity reaches: the evidence
        each of ``causes`` (entity, contributions) cites, looked up for those alone in one pass per symptom."""
        needed: dict[str, set[str]] = defaultdict(set)
        for entity, contributions in causes:
            for symptom, _ in contributions:
                needed[symptom].add(entity)
        refs: dict[tuple[str, str], list[str]] = defaultdict(list)
        for symptom, wanted in needed.items():
            for obs in groups[symptom]:
                if not wanted:
                    break
                reach = reach_cache[obs.entity]
                for entity in [e for e in wanted if e in reach] if len(wanted) < len(reach) else \
                        [e for e in reach if e in wanted]:
                    refs[(symptom, entity)].append(obs.ref)
                    if len(refs[(symptom, entity)]) == 5:
                        wanted.discard(entity)
        return refs

    # Collective symptoms (every rank of a stalled job shows them) add coverage but do not propose
    # candidates, unless nothing more specific was seen: that keeps a 10,000-rank hang cheap to rank.
    specific = {o.entity for o in observations if o.symptom not in COLLECTIVE_SYMPTOMS}
    proposers = specific or set(reach_cache)
    candidates: set[str] = set()
    for entity in proposers:
        candidates.update(reach_cache[entity])
    if admissible:
        candidates &= admissible
    # Jobs each candidate touches through its ranks, for peer spreading of collective symptoms.
    touched_jobs: dict[str, set[str]] = defaultdict(set)
    for entity in list(reach_cache):
        job = kg.rank_job.get(entity)
        if job is None:
            continue
        for source in reach_cache[entity]:
            touched_jobs[source].add(job)

    pagerank = kg.personalized_pagerank({o.entity: o.weight for o in observations}, among=candidates)
    top_pr = max(pagerank.values(), default=1.0)
    affected_nodes = {kg.node_of(e) for e in {o.entity for o in observations}} - {None}

    # A candidate's score adds one term per symptom in the symptoms' order, as it always has (the sums, and so the
    # ranking, stay bit for bit the same); a symptom the fault does not show there adds a constant, so only the
    # few (symptom, fault) pairs with both a likelihood and a coverage need a logarithm. Only the causes that can
    # be ranked (the pool explaining-away picks from) get their evidence listed.
    symptoms = list(groups)
    weights = [importance[s] for s in symptoms]
    log_one = math.log(1 + EPSILON)
    unexplained = [importance[s] * (math.log(EPSILON) - log_one) for s in symptoms]
    likelihoods: dict[str, list[float]] = {}
    faults_showing = [kb.faults_for_symptom(s) for s in symptoms]
    faults_of_kind: dict[str, list[str]] = {}
    peer_weights: dict[tuple[str, tuple[str, ...]], float] = {}
    found: list[tuple[float, str, str, list[tuple[str, float]]]] = []
    for entity in candidates:
        kind = kg.kind(entity)
        faults = faults_of_kind.get(kind)
        if faults is None:
            faults = faults_of_kind[kind] = kb.faults_for_kind(kind)
        if not faults:
            continue
        cov = []
        jobs = tuple(touched_jobs.get(entity, ()))
        for symptom in symptoms:
            direct = coverage[symptom].get(entity, 0.0)
            if jobs and symptom in COLLECTIVE_SYMPTOMS:
                peer_weight = peer_weights.get((symptom, jobs))
                if peer_weight is None:
                    peer_weight = peer_weights[(symptom, jobs)] = sum(job_weight[symptom].get(j, 0.0) for j in jobs)
                direct = direct + PEER_IMPACT * max(0.0, peer_weight - direct)
            cov.append(min(1.0, direct / group_total[symptom]) if group_total[symptom] else 0.0)
        pr_term = PAGERANK_WEIGHT * math.log(pagerank.get(entity, 0.0) / top_pr + 1e-6)
        spread_penalty = 0.0
        if kind == "switch":
            behind = kg.nodes_behind(entity)
            share = len(behind & affected_nodes) / len(behind) if behind else 0.0
            spread_penalty = 2.0 * math.log(share + EPSILON)
        # the faults that explain some symptom the entity covers; the others are no candidates
        explaining = {fault_name for i, c in enumerate(cov) if c
                      for fault_name, likelihood in faults_showing[i].items() if likelihood * c > 0}
        for fault_name in faults:
            if fault_name not in explaining:
                continue
            fault = kb.faults[fault_name]
            row = likelihoods.get(fault_name)
            if row is None:
                row = likelihoods[fault_name] = [kb.likelihood(s, fault_name) for s in symptoms]
            total = PRIOR_WEIGHT * kb.log_prior(fault_name) + pr_term
            if fault.spread == "children":
                total += spread_penalty
            contributions = []
            for i, likelihood in enumerate(row):
                shown = likelihood * cov[i]
                if shown == 0:
                    total += unexplained[i]
                    continue
                term = weights[i] * (math.log(EPSILON + shown) - log_one)
                total += term
                if shown > 0:
                    contributions.append((symptoms[i], term - weights[i] * math.log(EPSILON)))
            if contributions:
                found.append((total, entity, fault_name, contributions))
    pool = heapq.nsmallest(max(50, 5 * top_k), found, key=lambda c: (-c[0], c[1], c[2]))
    refs = cited((entity, contributions) for _, entity, _, contributions in pool)
    scored = []
    for total, entity, fault_name, contributions in pool:
        contributions.sort(key=lambda c: -c[1])
        evidence_refs = [r for s, _ in contributions for r in refs.get((s, entity), [])]
        scored.append(RankedCause(entity, fault_name, total, 0.0, contributions, evidence_refs))
    best = _explain_away(scored, max(top_k, 1), EXPLAIN_AWAY)
    for cause, prob in zip(best, _softmax([c.score for c in best]), strict=True):
        cause.probability = prob
    return best, len(found)


def _explain_away(pool: list[RankedCause], k: int, strength: float) -> list[RankedCause]:
    """Greedy ranking: each next cause is scored on what the causes above it leave unexplained (a candidate's
    gain on a symptom counts less by ``strength`` times the gain a ranked cause already has on it)."""
    if strength <= 0.0 or len(pool) <= 1:
        return pool[:k]
    gains = [dict(c.contributions) for c in pool]
    explained: dict[str, float] = {}
    chosen: list[RankedCause] = []
    left = list(range(len(pool)))
    while left and len(chosen) < k:
        def residual(i: int) -> float:
            overlap = sum(min(g, explained.get(s, 0.0)) for s, g in gains[i].items() if g > 0)
            return pool[i].score - strength * overlap
        best = max(left, key=lambda i: (residual(i), -i))
        left.remove(best)
        cause = pool[best]
        cause.score = residual(best)
        chosen.append(cause)
        for symptom, gain in gains[best].items():
            explained[symptom] = max(explained.get(symptom, 0.0), gain)
    return chosen


def admissible_causes(kg: KnowledgeGraph, incident: Incident, anomalies: Iterable[Anomaly] = ()) -> set[str]:
    """Entities whose fault can show at the incident's own entities through the topology (the entity itself,
    what hosts or cables it, a rank's job peers through the job). The evidence around an incident reaches other
    nodes of its jobs; a cause there must still have a path to what the incident is about, or a fault on
    another node would be named the root of this one."""
    anchors = {e for e in {*incident.entities, incident.scope, *(a.entity for a in anomalies)} if e in kg}
    out: set[str] = set()
    for anchor in anchors:
        out.update(v for v, strength in kg.causes_of(anchor).items() if strength >= MIN_REACH)
    return out


def incident_footprint(kg: KnowledgeGraph, incident: Incident, anomalies: Iterable[Anomaly] = ()) -> set[str]:
    """Entities whose events and logs belong to the incident: its entities, their nodes, jobs and ranks."""
    entities = set(incident.entities) | {incident.scope} | {a.entity for a in anomalies}
    footprint = set(entities)
    for entity in entities:
        node = kg.node_of(entity) if entity in kg else None
        if node:
            footprint.add(node)
        if entity in kg and kg.kind(entity) == "switch":
            footprint |= kg.nodes_behind(entity)
    return footprint


def _scope(kg: KnowledgeGraph, incident: Incident, anomalies: Sequence[Anomaly]) -> tuple[set[str], set[str]]:
    """The incident's footprint with the hosts of its jobs' ranks, and those jobs."""
    footprint = incident_footprint(kg, incident, anomalies)
    jobs = {e for e in footprint if entity_kind(e) == "job"} | {kg.rank_job[e] for e in footprint if e in kg.rank_job}
    for node in [e for e in footprint if e.startswith("node/")]:
        for gpu in kg.graph.successors(node):
            for rank in kg.graph.successors(gpu):
                if rank in kg.rank_job:
                    jobs.add(kg.rank_job[rank])
    # A job's incident reaches the hosts its ranks run on: their Xids and kernel lines are its evidence.
    for job in jobs:
        for rank in kg.job_ranks.get(job, []):
            host = kg.node_of(rank)
            if host:
                footprint.add(host)
    return footprint, jobs


def record_scope(kg: KnowledgeGraph, incident: Incident, anomalies: Sequence[Anomaly]) -> Callable[[str], bool]:
    """Whether a record of an entity is evidence of the incident: the entity is in its footprint (the ranks of
    its jobs, the hosts they run on, what sits on those hosts). ``select_records`` keeps exactly the records of the
    entities it accepts; ``record_entities`` names them all, for a reader that selects them in the database."""
    footprint, jobs = _scope(kg, incident, anomalies)

    def belongs(entity: str) -> bool:
        if entity in footprint:
            return True
        if entity in kg.rank_job:
            return kg.rank_job[entity] in jobs
        if entity in jobs:
            return True
        node = kg.node_of(entity) if entity in kg else None
        return node in footprint

    return belongs


def record_entities(kg: KnowledgeGraph, incident: Incident, anomalies: Sequence[Anomaly]) -> set[str]:
    """Every entity ``record_scope`` accepts, by name: the footprint, its jobs and their ranks, and the GPUs and
    NICs of its hosts (``Store.events(entities=...)`` reads only their records: a few thousand entities at most
    where the window holds records of the whole cluster)."""
    footprint, jobs = _scope(kg, incident, anomalies)
    wanted = footprint | jobs
    for job in jobs:
        wanted.update(kg.job_ranks.get(job, ()))
    for entity in footprint:
        wanted.update(kg.hosted(entity))
    return wanted


def select_records(kg: KnowledgeGraph, incident: Incident, anomalies: Sequence[Anomaly],
                   events: Sequence[Event], logs: Sequence[LogRecord], slack_s: float = 900.0,
                   ) -> tuple[list[Event], list[LogRecord]]:
    """The events and log lines of the incident's footprint (``record_scope``) and time window (plus slack)."""
    belongs = record_scope(kg, incident, anomalies)
    lo, hi = incident.start - slack_s, incident.end + slack_s
    chosen_events = [e for e in events if lo <= e.ts <= hi and belongs(e.entity)]
    chosen_logs = [r for r in logs if r.ts is not None and lo <= r.ts <= hi and belongs(r.entity)]
    return chosen_events, chosen_logs


def analyze_incident(
    kg: KnowledgeGraph,
    incident: Incident,
    anomalies: Sequence[Anomaly] = (),
    events: Sequence[Event] = (),
    logs: Sequence[LogRecord] = (),
    hang_culprits: Mapping[str, float] | None = None,
    top_k: int = 10,
) -> RcaResult:
    """Rank root causes of one incident from its anomalies and the events / logs around it."""
    started = time.perf_counter()
    own = [a for a in anomalies if not incident.anomalies or a.id in incident.anomalies]
    chosen_events, chosen_logs = select_records(kg, incident, own, events, logs)
    observations, evidence = observations_from(kg, incident, own, chosen_events, chosen_logs, hang_culprits)
    admissible = admissible_causes(kg, incident, own)
    causes, n_candidates = rank_observations(kg, observations, top_k=top_k, admissible=admissible)
    notes = []
    if not observations:
        notes.append("no evidence matched the knowledge base; nothing to rank")
    return RcaResult(incident.id, causes, observations, evidence, time.perf_counter() - started,
                     candidates=n_candidates, notes=notes)
