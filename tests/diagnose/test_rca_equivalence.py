"""The diagnosis's fast paths give exactly what the straightforward ones give: the knowledge base's log matching
(an RE2 set picking the signatures to try) against trying every signature, the ranking (sparse terms, the evidence
of the ranked pool only) against scoring every candidate x fault x symptom, and the anomalies selected by id in the
database against the window's anomalies filtered in Python."""

from __future__ import annotations

import math
import shutil
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import fields
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vigil.diagnose import rca
from vigil.diagnose.kb import KnowledgeBase, Signature, default_kb, load_kb
from vigil.diagnose.kg import PEER_IMPACT, KnowledgeGraph
from vigil.knowledge.files import kb_dir
from vigil.knowledge.line_prefix import split_prefix
from vigil.knowledge.signatures import SignatureMatcher
from vigil.model import Incident
from vigil.run.pipeline import run_pipeline
from vigil.sources.sim import SimConfig, simulate
from vigil.sources.sim.cluster import build_topology
from vigil.store.sql import Store

LOG_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "real"


def fixture_lines() -> list[str]:
    """Every line of the real failure-log fixtures."""
    return [line for path in sorted(LOG_FIXTURES.rglob("*")) if path.is_file() and path.suffix != ".yaml"
            for line in path.read_text(errors="replace").splitlines()]


def matched_one_by_one(kb: KnowledgeBase, line: str) -> list[Signature]:
    """``KnowledgeBase.match_log`` by its definition: every signature tried on the line, in library order."""
    prefix = split_prefix(line)
    text = line if prefix is None or prefix.syslog else prefix.payload
    found = [s for s in kb.signatures.values() if s.pattern.search(text)]
    return [s for s in found if not s.fallback] or found


def ranked_one_by_one(kg: KnowledgeGraph, observations: Sequence[rca.Observation], top_k: int = 10,
                      admissible: set[str] | None = None) -> tuple[list[rca.RankedCause], int]:
    """``rank_observations`` as it was written first: every candidate x fault scored over every symptom."""
    kb = kg.kb
    if not observations:
        return [], 0
    groups: dict[str, list[rca.Observation]] = defaultdict(list)
    for obs in observations:
        groups[obs.symptom].append(obs)
    group_total = {s: sum(o.weight for o in items) for s, items in groups.items()}
    importance = {s: min(1.5, max(o.weight for o in items))
                  * (rca.GENERIC_WEIGHT if s in rca.COLLECTIVE_SYMPTOMS else 1.0) for s, items in groups.items()}
    reach_cache: dict[str, dict[str, float]] = {}
    coverage: dict[str, dict[str, float]] = {s: defaultdict(float) for s in groups}
    refs: dict[str, dict[str, list[str]]] = {s: defaultdict(list) for s in groups}
    job_weight: dict[str, dict[str, float]] = {s: defaultdict(float) for s in groups}
    for symptom, items in groups.items():
        for obs in items:
            reach = reach_cache.get(obs.entity)
            if reach is None:
                reach = {v: k for v, k in kg.causes_of(obs.entity).items() if k >= rca.MIN_REACH}
                reach_cache[obs.entity] = reach
            for entity, strength in reach.items():
                coverage[symptom][entity] += obs.weight * strength
                if len(refs[symptom][entity]) < 5:
                    refs[symptom][entity].append(obs.ref)
            job = kg.rank_job.get(obs.entity)
            if job is not None:
                job_weight[symptom][job] += obs.weight
    specific = {o.entity for o in observations if o.symptom not in rca.COLLECTIVE_SYMPTOMS}
    candidates: set[str] = set()
    for entity in specific or set(reach_cache):
        candidates.update(reach_cache[entity])
    if admissible:
        candidates &= admissible
    touched_jobs: dict[str, set[str]] = defaultdict(set)
    for entity in list(reach_cache):
        job = kg.rank_job.get(entity)
        if job is not None:
            for source in reach_cache[entity]:
                touched_jobs[source].add(job)
    pagerank = kg.personalized_pagerank({o.entity: o.weight for o in observations}, among=candidates)
    top_pr = max(pagerank.values(), default=1.0)
    affected_nodes = {kg.node_of(o.entity) for o in observations} - {None}
    scored: list[rca.RankedCause] = []
    for entity in candidates:
        kind = kg.kind(entity)
        cov = {}
        for symptom in groups:
            direct = coverage[symptom].get(entity, 0.0)
            if symptom in rca.COLLECTIVE_SYMPTOMS and touched_jobs.get(entity):
                peer_weight = sum(job_weight[symptom].get(j, 0.0) for j in touched_jobs[entity])
                direct = direct + PEER_IMPACT * max(0.0, peer_weight - direct)
            cov[symptom] = min(1.0, direct / group_total[symptom]) if group_total[symptom] else 0.0
        pr_term = rca.PAGERANK_WEIGHT * math.log(pagerank.get(entity, 0.0) / top_pr + 1e-6)
        spread_penalty = 0.0
        if kind == "switch":
            behind = kg.nodes_behind(entity)
            share = len(behind & affected_nodes) / len(behind) if behind else 0.0
            spread_penalty = 2.0 * math.log(share + rca.EPSILON)
        for fault_name in kb.faults_for_kind(kind):
            total = rca.PRIOR_WEIGHT * kb.log_prior(fault_name) + pr_term
            if kb.faults[fault_name].spread == "children":
                total += spread_penalty
            contributions = []
            for symptom in groups:
                likelihood = kb.likelihood(symptom, fault_name)
                term = importance[symptom] * (math.log(rca.EPSILON + likelihood * cov[symptom])
                                              - math.log(1 + rca.EPSILON))
                total += term
                if likelihood * cov[symptom] > 0:
                    contributions.append((symptom, term - importance[symptom] * math.log(rca.EPSILON)))
            if contributions:
                contributions.sort(key=lambda c: -c[1])
                evidence_refs = [r for s, _ in contributions for r in refs[s].get(entity, [])]
                scored.append(rca.RankedCause(entity, fault_name, total, 0.0, contributions, evidence_refs))
    scored.sort(key=lambda c: (-c.score, c.entity, c.fault_type))
    best = rca._explain_away(scored[: max(50, 5 * top_k)], max(top_k, 1), rca.EXPLAIN_AWAY)
    for cause, prob in zip(best, rca._softmax([c.score for c in best]), strict=True):
        cause.probability = prob
    return best, len(scored)


def exactly(ranked: tuple[list[rca.RankedCause], int]) -> tuple[list[tuple[object, ...]], int]:
    causes, candidates = ranked
    return [(c.entity, c.fault_type, c.score, c.probability, c.contributions, c.evidence_refs)
            for c in causes], candidates


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, KnowledgeGraph, list[Incident]]:
    """A stored simulated run with its faults (every catalogue fault type over the seeds' plans): 24 nodes."""
    run = simulate(SimConfig(nodes=24, gpus=8, minutes=40, seed=11))
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('equivalence') / 'vigil.db'}")
    result = run_pipeline(run, store=store)
    assert len(result.incidents) >= 5
    return store, KnowledgeGraph.build(run.topology), result.incidents


def test_a_stored_runs_diagnoses_rank_exactly_as_scoring_every_candidate(
        simulated: tuple[Store, KnowledgeGraph, list[Incident]]) -> None:
    """Every incident of a simulated store, read as ``vigil serve`` reads it: the anomalies chosen by id in the
    database are the window's filtered in Python (same order), the observations are those of the one-by-one
    matcher, and the ranking (scores, probabilities, contributions, cited evidence, candidates) is bit for bit the
    straightforward one's."""
    store, kg, incidents = simulated
    slack = 900.0
    ranked = 0
    for incident in incidents:
        wanted = set(incident.anomalies)
        window = [a for a in store.anomalies(since=incident.start - slack, limit=100_000) if a.id in wanted]
        anomalies = store.anomalies(since=incident.start - slack, limit=100_000, ids=incident.anomalies)
        assert [a.id for a in anomalies] == [a.id for a in window]
        own = [a for a in anomalies if a.id in wanted]
        entities = rca.record_entities(kg, incident, own)
        events = store.events(since=incident.start - slack, until=incident.end + slack, limit=100_000,
                              entities=entities)
        logs = store.logs(since=incident.start - slack, until=incident.end + slack, limit=100_000, entities=entities)
        observations, evidence = rca.observations_from(kg, incident, own, events, logs)
        fast = [(o.symptom, o.entity, o.weight, o.ts, o.summary) for o in observations]
        kb = kg.kb
        kb.match_log = lambda line, kb=kb: matched_one_by_one(kb, line)  # type: ignore[method-assign]
        try:
            slow, _ = rca.observations_from(kg, incident, own, events, logs)
        finally:
            del kb.match_log
        assert fast == [(o.symptom, o.entity, o.weight, o.ts, o.summary) for o in slow]
        admissible = rca.admissible_causes(kg, incident, own)
        new = exactly(rca.rank_observations(kg, observations, admissible=admissible))
        assert new == exactly(ranked_one_by_one(kg, observations, admissible=admissible))
        ranked += bool(new[0])
    assert ranked >= 5


SMALL = build_topology(nodes=8, gpus=8, nodes_per_switch=4, job_nodes=8)


@pytest.fixture(scope="module")
def small_kg() -> KnowledgeGraph:
    return KnowledgeGraph.build(SMALL)


SYMPTOMS = sorted({"hang", "crash", *rca.COLLECTIVE_SYMPTOMS, "xid:79", "xid:48", "xid:94", "log:nccl_timeout",
                   "anomaly:link_down", "anomaly:gpu_lost", "anomaly:job_hang", "anomaly:ecc_error",
                   "peer:silent_rank", "peer:stack", "signal:SIGKILL", "metric:DCGM_FI_DEV_GPU_TEMP"})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_small_set_of_observations_ranks_exactly_as_scoring_every_candidate(small_kg: KnowledgeGraph,
                                                                                 data: st.DataObject) -> None:
    entities = sorted(e for e in small_kg.graph.nodes if e in small_kg and small_kg.kind(e) in
                      ("gpu", "nic", "node", "switch", "rank", "job"))
    observed = data.draw(st.lists(st.tuples(st.sampled_from(SYMPTOMS), st.sampled_from(entities),
                                            st.floats(0.05, 2.0), st.integers(0, 6)), min_size=1, max_size=40))
    observations = [rca.Observation(symptom, entity, weight, f"ev-{ref}", 0.0, "")
                    for symptom, entity, weight, ref in observed]
    admissible = set(data.draw(st.lists(st.sampled_from(entities), max_size=20)))
    top_k = data.draw(st.integers(1, 12))
    assert exactly(rca.rank_observations(small_kg, observations, top_k, admissible)) == exactly(
        ranked_one_by_one(small_kg, observations, top_k, admissible))


def test_log_matching_picks_the_signatures_trying_each_would(shared_data: Path,
                                                             capfd: pytest.CaptureFixture[str]) -> None:
    """On the real log corpora and lines RE2 must not be trusted with (non-ASCII, tabs, line ends, past its
    length bound), the signatures a line matches, in order, are those of trying every signature; RE2's DFA stays
    within its memory budget."""
    kb = default_kb()
    lines = fixture_lines()
    for path in sorted((shared_data / "xid" / "log_samples").glob("*.log")):
        lines += path.read_text(errors="replace").splitlines()
    for path in sorted((shared_data / "loghub2k_corrected").rglob("*_2k.log")):
        lines += path.read_text(errors="replace").splitlines()
    timeout = "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600043 ms"
    lines += [timeout.replace(" ", "\t"), timeout + "\n", timeout.replace("o", "\u00f6", 1), "x" * 5000 + timeout,
              "NVRM: Xid (PCI:0000:5d:00): 79, pid=0, name=python, GPU has fallen off the bus.",
              "Received Generic Notice type:\u0661 num:129 (x)"]  # a digit to Python's \d, none to RE2's
    assert len(lines) > 20000
    capfd.readouterr()
    hits = 0
    for line in lines:
        found = kb.match_log(line)
        assert found == matched_one_by_one(kb, line), line
        hits += bool(found)
    assert "DFA out of memory" not in capfd.readouterr().err
    assert kb._signature_set, "google-re2 is a pinned dependency"
    assert hits >= 500


@lru_cache(maxsize=1)
def matched_fixture_lines() -> list[str]:
    """The real failure-log fixtures' lines that some signature matches."""
    kb = default_kb()
    return [line for line in fixture_lines() if matched_one_by_one(kb, line)]


def test_a_line_with_a_tab_is_matched_through_the_signature_set() -> None:
    """A tab is ``\\s`` and ``.`` to RE2 and ``re`` alike: a line with one takes the set, not every signature in turn
    (before, it failed ``str.isprintable`` and was tried against all of them)."""
    kb = load_kb()
    timeout = "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600043 ms"
    kb.match_log(timeout)  # builds the set
    assert isinstance(kb._signature_set, tuple)
    regex_set, index_of = kb._signature_set
    asked: list[str] = []

    class Watched:
        def Match(self, line: str) -> list[int]:  # noqa: N802 - RE2's name
            asked.append(line)
            return regex_set.Match(line)  # type: ignore[no-any-return]

    kb._signature_set = (Watched(), index_of)
    line = f"[rank3]:\t{timeout}\tbefore timing out."
    found = kb.match_log(line)
    assert found and found == matched_one_by_one(kb, line)
    assert len(asked) == 1 and asked[0].endswith("\tbefore timing out.")  # the payload, its rank prefix cut


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_line_with_tabs_is_matched_as_trying_each_signature_would(data: st.DataObject) -> None:
    """Real lines some signature matches, with spaces turned into tabs and tabs put in anywhere: the set's
    answer is the answer of every signature tried in turn."""
    kb = default_kb()
    line = data.draw(st.sampled_from(matched_fixture_lines()))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(line)))
        line = line[:at] + data.draw(st.sampled_from(["\t", "\t\t", " \t"])) + line[at:]
    line = "".join(data.draw(st.sampled_from([" ", "\t"])) if char == " " else char for char in line)
    assert kb.match_log(line) == matched_one_by_one(kb, line), line


def kb_with_signature(tmp_path: Path, pattern: str) -> Path:
    """A copy of the shipped knowledge base with one more signature (id site.lanes_lost), ``pattern``."""
    shutil.copytree(kb_dir(), tmp_path / "kb")
    with (tmp_path / "kb" / "signatures.yaml").open("a") as library:
        library.write("- id: site.lanes_lost\n  symptom: gpu_fallen_off_bus\n  level: observe\n  role: root\n"
                      f"  pattern: '{pattern}'\n  description: A site's own line.\n")
    return tmp_path / "kb"


def test_without_a_compiled_signature_set_every_signature_is_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    """RE2 refusing to compile the set (a budget too small for the library, say) leaves no line unmatched: the
    knowledge base and triage's matcher try every signature with ``re``."""
    import re2

    def refuse(self: object) -> None:
        raise re2.error("failed to compile Set")

    monkeypatch.setattr(re2.Set, "Compile", refuse)
    kb = load_kb()
    lines = fixture_lines()
    hits = 0
    for line in lines:
        found = kb.match_log(line)
        assert found == matched_one_by_one(kb, line), line
        hits += bool(found)
    assert kb._signature_set is False
    assert hits >= 500
    matcher = SignatureMatcher()
    assert matcher._set is None
    hit = matcher.match("[rank3]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
                        "OpType=ALLREDUCE) ran for 600043 ms before timing out.")
    assert hit is not None and "timeout" in hit.kind


def test_a_signature_the_engines_read_apart_is_tried_with_re(tmp_path: Path) -> None:
    """A POSIX class is one to RE2 and a set of characters to Python (which decides the match): RE2 would pass over
    the line Python matches, so the signature is tried on every line."""
    kb = load_kb(kb_with_signature(tmp_path, "[[:digit:]]+ lanes lost"))
    line = "link t] lanes lost"  # Python's [[:digit:]] is one of "[:digt" and then "]"
    assert [s.name for s in matched_one_by_one(kb, line)] == ["site.lanes_lost"]
    assert kb.match_log(line) == matched_one_by_one(kb, line)
    assert kb._signature_set


def test_a_line_matched_as_the_signature_set_is_published_sees_the_signatures_re2_cannot_hold(
        tmp_path: Path) -> None:
    """``vigil serve`` diagnoses on several threads with one knowledge base, whose signature set is built at the
    first line: a line matched the moment the set is published (on another thread) still tries the signatures RE2
    cannot compile (a look-ahead here)."""
    loaded = load_kb(kb_with_signature(tmp_path, "lanes lost(?! again)"))
    line = "link 3 lanes lost"
    seen: list[list[str]] = []

    class Watched(KnowledgeBase):
        def __setattr__(self, name: str, value: object) -> None:
            super().__setattr__(name, value)
            if name == "_signature_set" and value:
                seen.append([s.name for s in self.match_log(line)])

    kb = Watched(**{f.name: getattr(loaded, f.name) for f in fields(loaded) if f.init})
    assert [s.name for s in kb.match_log(line)] == ["site.lanes_lost"]
    assert seen == [["site.lanes_lost"]]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_line_with_letters_of_other_scripts_is_matched_as_trying_each_signature_would(data: st.DataObject) -> None:
    """Real lines some signature matches, with Chinese, Cyrillic or accented letters put in anywhere: the set, asked
    with the letters made one ASCII letter, picks what every signature tried in turn on the line itself picks."""
    kb = default_kb()
    line = data.draw(st.sampled_from(matched_fixture_lines()))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(line)))
        line = line[:at] + data.draw(st.sampled_from(["\u4e2d", "\u9519\u8bef\uff1a", "\u0436", "\u00e9"])) + line[at:]
    assert kb.match_log(line) == matched_one_by_one(kb, line), line
