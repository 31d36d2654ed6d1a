"""The fault knowledge base: symptom -> fault -> cause -> remedy, assembled from the knowledge tables.

Files (all under one directory, the package's ``vigil/knowledge/data/kb`` by default):

- ``faults.yaml``: THE fault catalogue (``vigil.knowledge.faults``): entity kinds, level, causes,
  P(symptom | fault), remedies, weight;
- ``signatures.yaml``: THE log-signature library (``vigil.knowledge.signatures``); a signature that names a
  symptom is the RCA symptom ``log:<symptom>``;
- ``trace.yaml``: the real StepFun trace's fault classes -> fault types with counts (the priors);
- ``actions.yaml``: the remediation whitelist (``vigil.knowledge.actions``).

Xid codes come from THE Xid table (``vigil.knowledge.xid``). The knowledge base is valid on its own: it
checks its cross-references (symptoms name known faults, findings, signatures, Xids and metrics), not that
it mirrors any other component's list.
"""

from __future__ import annotations

import math
import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from vigil.knowledge.actions import load_action_whitelist
from vigil.knowledge.faults import ENTITY_KINDS, FaultEntry, load_fault_catalogue
from vigil.knowledge.files import kb_dir
from vigil.knowledge.line_prefix import split_prefix
from vigil.knowledge.metrics import metric_catalogue
from vigil.knowledge.signatures import (
    MAX_MATCH_CHARS,
    load_signature_file,
    proxies_letters,
    re2_screen_line,
    signature_set,
)
from vigil.knowledge.xid import known_xids, xid_info
from vigil.model import ActionKind, FaultLevel, VigilInputError

SYMPTOM_PREFIXES = ("anomaly", "xid", "log", "metric", "peer", "signal")
BARE_SYMPTOMS = ("hang", "crash")


@dataclass(frozen=True)
class Remedy:
    action: ActionKind
    on: str
    risk: str
    why: str


@dataclass(frozen=True)
class Fault:
    name: str
    entity_kinds: tuple[str, ...]
    level: FaultLevel
    title: str
    causes: tuple[str, ...]
    symptoms: dict[str, float]
    remedies: tuple[Remedy, ...]
    spread: str | None = None
    pseudo_count: float = 0.0


@dataclass(frozen=True)
class Signature:
    name: str
    pattern: re.Pattern[str]
    meaning: str
    fault_type: str | None = None
    symptom_name: str | None = None  # the RCA symptom the library names for it (default: its own name)
    fallback: bool = False  # counts only for a line no other signature matches (signatures.yaml)

    @property
    def symptom(self) -> str:
        return f"log:{self.symptom_name or self.name}"


@dataclass(frozen=True)
class XidEntry:
    code: int
    mnemonic: str
    level: FaultLevel
    fault: str


@dataclass(frozen=True)
class TraceClass:
    level: str
    cls: str
    desc: str
    count: int
    fault: str | None


@dataclass
class KnowledgeBase:
    versions: dict[str, int]
    faults: dict[str, Fault]
    signatures: dict[str, Signature]
    xids: dict[int, XidEntry]
    trace: list[TraceClass]
    action_templates: dict[ActionKind, tuple[str, str]]
    findings: frozenset[str] = frozenset()
    source: str = "package"
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    _by_symptom: dict[str, dict[str, float]] = field(default_factory=dict, repr=False)
    _log_prior: dict[str, float] = field(default_factory=dict, repr=False)
    # The signatures in library order; RE2's set of them (with the map of its slots to that order) and those it
    # cannot hold; None until the first line is matched, False where there is no set.
    _ordered: list[Signature] = field(default_factory=list, repr=False)
    _signature_set: tuple[Any, list[int]] | None | bool = field(default=None, repr=False)
    _python_only: list[int] = field(default_factory=list, repr=False)
    _letters: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self._index()

    def _index(self) -> None:
        """Fold Xid codes and signature fault types into the likelihood table and compute log priors."""
        for entry in self.xids.values():
            fault = self.faults.get(entry.fault)
            symptom = f"xid:{entry.code}"
            if fault is not None and symptom not in fault.symptoms:
                fault.symptoms[symptom] = 0.7 if entry.level >= FaultLevel.DRAIN else 0.4
        for signature in self.signatures.values():
            fault = self.faults.get(signature.fault_type or "")
            if fault is not None and signature.symptom not in fault.symptoms:
                fault.symptoms[signature.symptom] = 0.9
        self._by_symptom = {}
        for fault in self.faults.values():
            fault.symptoms.setdefault(f"anomaly:{fault.name}", 1.0)
            for symptom, likelihood in fault.symptoms.items():
                self._by_symptom.setdefault(symptom, {})[fault.name] = likelihood
        counts = {name: fault.pseudo_count + 1.0 for name, fault in self.faults.items()}
        for item in self.trace:
            if item.fault in counts:
                counts[item.fault] += item.count
        total = sum(counts.values()) or 1.0
        self._log_prior = {name: math.log(count / total) for name, count in counts.items()}

    def likelihood(self, symptom: str, fault: str) -> float:
        return self._by_symptom.get(symptom, {}).get(fault, 0.0)

    def faults_for_symptom(self, symptom: str) -> dict[str, float]:
        return self._by_symptom.get(symptom, {})

    def log_prior(self, fault: str) -> float:
        prior = self._log_prior.get(fault)
        return prior if prior is not None else min(self._log_prior.values(), default=0.0)

    def faults_for_kind(self, kind: str) -> list[str]:
        return [f.name for f in self.faults.values() if kind in f.entity_kinds]

    def match_log(self, line: str) -> list[Signature]:
        """The signatures a line matches; a fallback one (any Python exception's last line) only when no other
        does, so "torch.OutOfMemoryError: CUDA out of memory" is the CUDA OOM and not also an application error."""
        prefix = split_prefix(line)
        # a syslog header names the program, and signatures may read it ("slurmctld[42]: fatal: ...")
        found = self._match_any(line if prefix is None or prefix.syslog else prefix.payload)
        specific = [s for s in found if not s.fallback]
        return specific or found

    def _index_signatures(self) -> None:
        """One RE2 set of every signature: a single linear pass names the signatures a line can match, where
        Python's ``re`` tried each of them at every position of every line (a diagnosis matches thousands of lines
        against about 80 signatures: 2 of a diagnosis's 5 s on 10,000 GPUs)."""
        ordered = list(self.signatures.values())
        patterns = [f"(?i:{s.pattern.pattern})" for s in ordered]
        built = signature_set(patterns)
        # the set last: a diagnosis on another thread that finds it also finds the order, the python-only list and
        # whether letters of other scripts may be screened as one ASCII letter
        self._ordered, self._python_only = ordered, [] if built is None else built[1]
        self._letters = proxies_letters(patterns)
        self._signature_set = False if built is None else built[0]

    def _match_any(self, line: str) -> list[Signature]:
        """Every signature ``line`` matches, in library order. Python's ``re`` decides each match; RE2's set only
        picks which signatures to try, on lines both engines read alike or whose letters of other scripts may be
        read as one ASCII letter (``re2_screen_line``) and short enough for its DFA's memory budget; any other line is
        tried against every signature."""
        if self._signature_set is None:
            self._index_signatures()
        ordered, regex_set = self._ordered, self._signature_set
        screened = None if not regex_set or len(line) > MAX_MATCH_CHARS else re2_screen_line(line, self._letters)
        if screened is None:
            return [s for s in ordered if s.pattern.search(line)]
        assert isinstance(regex_set, tuple)
        matcher, index_of = regex_set
        tried = sorted({*(index_of[i] for i in matcher.Match(screened) or ()), *self._python_only})
        return [ordered[i] for i in tried if ordered[i].pattern.search(line)]

    def summary(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "versions": self.versions,
            "faults": len(self.faults),
            "signatures": len(self.signatures),
            "xids": len(self.xids),
            "trace_classes": len(self.trace),
            "trace_faults_mapped": sum(t.count for t in self.trace if t.fault),
            "trace_faults_total": sum(t.count for t in self.trace),
            "actions": sorted(a.value for a in self.action_templates),
        }


# --------------------------------------------------------------------------- loading


def _need(mapping: Any, key: str, where: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(mapping, dict) or key not in mapping:
        raise VigilInputError(f"{where}: missing field {key!r}")
    value = mapping[key]
    if not isinstance(value, kind):
        raise VigilInputError(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _fault(name: str, entry: FaultEntry) -> Fault:
    return Fault(
        name=name,
        entity_kinds=tuple(entry.entity),
        level=entry.level,
        title=entry.title,
        causes=tuple(entry.causes),
        symptoms=dict(entry.symptoms),
        remedies=tuple(Remedy(r.action, r.target, r.risk, r.why) for r in entry.remedies),
        spread=entry.spread,
        pseudo_count=entry.pseudo_count,
    )


def load_kb(directory: Path | None = None) -> KnowledgeBase:
    """Read and cross-check the knowledge base; structural errors raise VigilInputError naming the file."""
    base, source = (kb_dir(), "package") if directory is None else (directory, str(directory))
    catalogue = load_fault_catalogue(base)
    faults = {name: _fault(name, entry) for name, entry in catalogue.faults.items()}
    # THE signature library; a signature is an RCA symptom (log:<symptom>) when it names one. RCA matches
    # messages and log lines alike, so case is ignored here.
    library = load_signature_file(base)
    signatures = {s.id: Signature(s.id, re.compile(s.pattern.removeprefix("(?i)"), re.IGNORECASE), s.description,
                                  s.fault, s.symptom, s.fallback)
                  for s in library.signatures if s.symptom is not None}

    xids = {code: XidEntry(code, info.mnemonic, info.level, info.fault)
            for code in known_xids() for info in (xid_info(code),)}
    trace = [TraceClass(t.level, t.cls, t.desc, t.count, t.fault) for t in catalogue.trace]
    templates = {action: (entry.target, entry.command) for action, entry in load_action_whitelist(base).items()}
    versions = {**catalogue.versions, "signatures": library.version}
    kb = KnowledgeBase(versions, faults, signatures, xids, trace, templates, findings=frozenset(catalogue.findings),
                       source=source)
    kb.problems = catalogue.problems() + validate_kb(kb)
    return kb


@lru_cache(maxsize=1)
def default_kb() -> KnowledgeBase:
    return load_kb()


# --------------------------------------------------------------------------- validation


def _symptom_problem(symptom: str, kb: KnowledgeBase) -> str | None:
    if symptom in BARE_SYMPTOMS:
        return None
    prefix, _, rest = symptom.partition(":")
    if prefix not in SYMPTOM_PREFIXES or not rest:
        return f"symptom {symptom!r} is not of the form <{'|'.join(SYMPTOM_PREFIXES)}>:<name>, hang or crash"
    if prefix == "anomaly" and rest not in kb.faults and rest not in kb.findings:
        return f"symptom {symptom!r} names an unknown fault type or detector finding"
    if prefix == "log" and rest not in {s.symptom_name or s.name for s in kb.signatures.values()}:
        return f"symptom {symptom!r} names an unknown log signature"
    if prefix == "xid" and (not rest.isdigit() or int(rest) not in kb.xids):
        return f"symptom {symptom!r} names an Xid that is not in the Xid table"
    if prefix == "metric" and rest not in metric_catalogue():
        return f"symptom {symptom!r} names a metric that is not in the metric catalogue"
    if prefix == "signal" and rest not in signal.Signals.__members__:
        return f"symptom {symptom!r} names no POSIX signal (SIGKILL, SIGTERM, ...)"
    return None


def validate_kb(kb: KnowledgeBase, expected_faults: Iterable[str] = ()) -> list[str]:
    """Cross-references that YAML structure alone cannot check; empty list = valid. ``expected_faults``
    names fault types a caller needs covered (an evaluation's fault list, say)."""
    problems = []
    for fault in kb.faults.values():
        for kind in fault.entity_kinds:
            if kind not in ENTITY_KINDS:
                problems.append(f"faults.yaml: {fault.name}: unknown entity kind {kind!r}")
        for symptom in fault.symptoms:
            problem = _symptom_problem(symptom, kb)
            if problem:
                problems.append(f"faults.yaml: {fault.name}: {problem}")
    for entry in kb.xids.values():
        if entry.fault not in kb.faults and entry.fault not in kb.findings:
            problems.append(f"Xid table: xid {entry.code}: unknown fault type {entry.fault!r}")
    for name in expected_faults:
        if name not in kb.faults:
            problems.append(f"faults.yaml: fault type {name!r} has no knowledge entry")
    return sorted(set(problems))
