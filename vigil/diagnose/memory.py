"""Memory of past incidents: every resolved incident summarized (root cause, actions taken, outcome) and
stored, and a lexical index (scikit-learn TF-IDF, cosine similarity; nothing downloaded) that finds the past
incidents most like a new one, with what fixed them.

An incident and a memory are turned into text the same way (fault types, root cause, entity kinds and names,
title, the first evidence lines), so a new incident is matched against past ones term by term."""

from __future__ import annotations

import re
import time

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer

from vigil.model import (
    Action,
    ActionStatus,
    Diagnosis,
    Incident,
    IncidentMemory,
    IncidentStatus,
    SimilarIncident,
    VigilInputError,
    parse_entity,
)
from vigil.store.sql import Store

MAX_EVIDENCE = 5
# Numbers, hex ids and timestamps say nothing about what kind of incident this was.
_NOISE = re.compile(r"\b(?:0x[0-9a-f]+|[0-9a-f]{8,}|\d+(?:\.\d+)?)\b", re.IGNORECASE)
_DONE = (ActionStatus.EXECUTED, ActionStatus.APPROVED)


def summarize(incident: Incident, diagnosis: Diagnosis | None, actions: list[Action],
              now: float | None = None) -> IncidentMemory:
    """A resolved incident's memory: the diagnosis' root cause when one was stored (else the incident's own
    scope and first fault type), the actions with their status, and how it ended."""
    if incident.status is not IncidentStatus.RESOLVED:
        raise VigilInputError(f"incident {incident.id} is {incident.status.value}; only resolved incidents are "
                              "remembered")
    root = diagnosis.root_cause if diagnosis is not None else None
    done = [a for a in actions if a.status in _DONE]
    lines = [f"{a.kind.value} {a.target} ({a.status.value}{': ' + a.result[:120] if a.result else ''})"
             for a in actions]
    resolved_after = max(0.0, incident.end - incident.start)
    if done:
        outcome = (f"resolved after {resolved_after / 60:.0f} min with {len(done)} action(s) taken: "
                   + "; ".join(f"{a.kind.value} {a.target}" for a in done))
    elif actions:
        outcome = f"resolved after {resolved_after / 60:.0f} min; {len(actions)} action(s) proposed, none taken"
    else:
        outcome = f"resolved after {resolved_after / 60:.0f} min with no action recorded"
    return IncidentMemory(
        incident_id=incident.id, title=incident.title, scope=incident.scope, fault_types=incident.fault_types,
        level=incident.level, start=incident.start, end=incident.end, resolved_after_s=resolved_after,
        root_cause_entity=root.entity if root else incident.scope,
        root_cause_fault=root.fault_type if root else (incident.fault_types[0] if incident.fault_types else ""),
        root_cause_from="diagnosis" if root else "incident",
        summary=diagnosis.summary[:1000] if diagnosis is not None else "",
        actions=lines[:20], outcome=outcome,
        evidence=[e.summary[:300] for e in incident.evidence[:MAX_EVIDENCE]],
        remembered_at=time.time() if now is None else now)


def _entity_terms(entity: str) -> list[str]:
    try:
        kind, parts = parse_entity(entity)
    except VigilInputError:
        return []
    return [kind, *(p for p in parts if isinstance(p, str))]


def incident_text(title: str, fault_types: list[str], scope: str, root_fault: str, root_entity: str,
                  evidence: list[str]) -> str:
    """The words an incident is indexed and queried by. Fault types are kept whole (gpu_dbe) and repeated, so
    they weigh more than the words of free text."""
    faults = [f for f in [root_fault, *fault_types] if f]
    words = [*faults, *faults, *_entity_terms(scope), *_entity_terms(root_entity), title, *evidence]
    return _NOISE.sub(" ", " ".join(words))


def memory_text(memory: IncidentMemory) -> str:
    return incident_text(memory.title, memory.fault_types, memory.scope, memory.root_cause_fault,
                         memory.root_cause_entity, memory.evidence)


def query_text(incident: Incident, diagnosis: Diagnosis | None) -> str:
    root = diagnosis.root_cause if diagnosis is not None else None
    return incident_text(incident.title, incident.fault_types, incident.scope, root.fault_type if root else "",
                         root.entity if root else "", [e.summary[:300] for e in incident.evidence[:MAX_EVIDENCE]])


class MemoryIndex:
    """TF-IDF over the memories' text; ``similar`` ranks them by cosine similarity to a query."""

    def __init__(self, memories: list[IncidentMemory]) -> None:
        self.memories = memories
        # Tokens keep underscores and slashes' parts apart from free text's punctuation: gpu_dbe, nic, n003.
        self.vectorizer_ = TfidfVectorizer(token_pattern=r"(?u)\b[a-zA-Z][\w-]+\b", stop_words="english",
                                           sublinear_tf=True)
        self.matrix_ = self.vectorizer_.fit_transform([memory_text(m) for m in memories]) if memories else None

    def similar(self, text: str, k: int = 3, exclude: set[str] | None = None) -> list[SimilarIncident]:
        """The ``k`` memories most like ``text`` (any with no term in common are left out)."""
        if self.matrix_ is None or not text.strip():
            return []
        scores = (self.matrix_ @ self.vectorizer_.transform([text]).T).toarray().ravel()
        out: list[SimilarIncident] = []
        for index in np.argsort(-scores, kind="stable"):
            memory = self.memories[index]
            if scores[index] <= 0.0 or len(out) >= k:
                break
            if exclude and memory.incident_id in exclude:
                continue
            out.append(SimilarIncident(
                incident_id=memory.incident_id, score=round(min(1.0, float(scores[index])), 4), title=memory.title,
                root_cause_fault=memory.root_cause_fault, root_cause_entity=memory.root_cause_entity,
                actions=memory.actions, outcome=memory.outcome, resolved_after_s=memory.resolved_after_s))
        return out


def remember(store: Store, incident: Incident, now: float | None = None) -> IncidentMemory:
    """Summarize a resolved incident from what the store holds about it, and store the summary."""
    memory = summarize(incident, store.diagnosis(incident.id), store.actions(incident_id=incident.id), now)
    store.save_memory(memory)
    return memory


def remember_resolved(store: Store, limit: int = 100_000) -> int:
    """Remember every resolved incident not remembered yet; the count written."""
    known = store.remembered_ids()
    written = 0
    for incident in store.incidents(status=IncidentStatus.RESOLVED, limit=limit):
        if incident.id not in known:
            remember(store, incident)
            written += 1
    return written


def recall(store: Store, incident: Incident, diagnosis: Diagnosis | None = None, k: int = 3
           ) -> list[SimilarIncident]:
    """Past incidents like ``incident`` and what fixed them, from the store's memory (itself left out)."""
    remember_resolved(store)
    index = MemoryIndex([m for m in store.memories() if m.incident_id != incident.id and m.end <= incident.start])
    return index.similar(query_text(incident, diagnosis), k=k)
