"""The fault knowledge base: symptom -> fault -> cause -> remedy, from versioned YAML in vigil/knowledge/data/kb.

Files (all under one directory, the package's ``vigil/knowledge/data/kb`` by default):

- ``faults.yaml``: fault types with entity kinds, level, causes, P(symptom | fault) and remedies;
- ``signatures.yaml``: log signatures (NCCL / CUDA / kernel) -> ``log:<name>`` symptoms;
- ``xid.yaml``: every Xid code of the catalogue -> its primary fault type (seeded by :func:`seed_xid_yaml`);
- ``trace.yaml``: the real StepFun trace's fault classes -> fault types with counts (the priors);
- ``actions.yaml``: the remediation whitelist with the only command each action may carry.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from vigil.config import read_yaml
from vigil.model import ActionKind, FaultLevel, VigilInputError

ENTITY_KINDS = ("gpu", "node", "nic", "switch", "rack", "job", "rank", "cluster")
SYMPTOM_PREFIXES = ("anomaly", "xid", "log", "metric", "peer")
BARE_SYMPTOMS = ("hang", "crash")
KB_FILES = ("faults.yaml", "signatures.yaml", "xid.yaml", "trace.yaml", "actions.yaml")

# The primary fault type of Xid codes whose meaning is specific; every other code maps to gpu_xid.
XID_PRIMARY_FAULT: dict[int, str] = {
    48: "gpu_dbe", 94: "gpu_dbe", 95: "gpu_dbe",
    63: "gpu_row_remap_failure", 64: "gpu_row_remap_failure",
    79: "gpu_lost",
    92: "gpu_sbe_storm",
    119: "gpu_gsp_timeout", 120: "gpu_gsp_timeout",
    74: "nvlink_error", 144: "nvlink_error", 145: "nvlink_error", 146: "nvlink_error", 147: "nvlink_error",
    148: "nvlink_error", 149: "nvlink_error", 150: "nvlink_error",
}


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
    alias: str | None = None  # an external signature produces the symptom of this KB signature

    @property
    def symptom(self) -> str:
        return f"log:{self.alias or self.name}"


_DIGIT = re.compile(r"\d")


def _has_digit(signature: Signature) -> bool:
    return any(ch.isdigit() for ch in signature.pattern.pattern)


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
    _any_signature: re.Pattern[str] | None = field(default=None, repr=False)
    _by_shape: dict[str, list[Signature]] = field(default_factory=dict, repr=False)
    _digit_signatures: list[Signature] = field(default_factory=list, repr=False)
    _any_digit_signature: re.Pattern[str] = field(default_factory=lambda: re.compile(""), repr=False)

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
        # One combined search rejects the many lines that match nothing before the per-signature searches.
        if self._any_signature is None:
            try:
                self._any_signature = re.compile(
                    "|".join(f"(?:{s.pattern.pattern})" for s in self.signatures.values()), re.IGNORECASE)
            except re.error:  # a pattern with inline global flags cannot be nested: search one by one
                self._any_signature = re.compile("")
            self._digit_signatures = [s for s in self.signatures.values() if _has_digit(s)]
            try:
                self._any_digit_signature = re.compile(
                    "|".join(f"(?:{s.pattern.pattern})" for s in self._digit_signatures) or "(?!)", re.IGNORECASE)
            except re.error:
                self._any_digit_signature = re.compile("")
        if not self._any_signature.search(line):
            return []
        # Lines that differ only in digit values (rank numbers, addresses, counters) match the same
        # digit-free patterns; only patterns with digits in them (status=12, Xid codes) are searched again.
        shape = _DIGIT.sub("0", line)
        known = self._by_shape.get(shape)
        if known is None:
            found = [s for s in self.signatures.values() if s.pattern.search(line)]
            if len(self._by_shape) < 4096:
                self._by_shape[shape] = [s for s in found if not _has_digit(s)]
            return found
        if not self._any_digit_signature.search(line):
            return list(known)
        return known + [s for s in self._digit_signatures if s.pattern.search(line)]

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


def _read_yaml(directory: Path, name: str) -> dict[str, Any]:
    path = directory / name
    data = read_yaml(path, "knowledge base file")
    if not isinstance(data, dict) or not isinstance(data.get("version"), int):
        raise VigilInputError(f"knowledge base file {path}: expected a mapping with an integer 'version'")
    return data


def _need(mapping: Any, key: str, where: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(mapping, dict) or key not in mapping:
        raise VigilInputError(f"{where}: missing field {key!r}")
    value = mapping[key]
    if not isinstance(value, kind):
        raise VigilInputError(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _parse_fault(name: str, raw: Any, where: str) -> Fault:
    where = f"{where}: fault {name!r}"
    kinds = _need(raw, "entity", where, list)
    try:
        level = FaultLevel.parse(_need(raw, "level", where, str))
    except VigilInputError as err:
        raise VigilInputError(f"{where}: {err}") from None
    symptoms = raw.get("symptoms") or {}
    if not isinstance(symptoms, dict):
        raise VigilInputError(f"{where}: field 'symptoms' must be a mapping symptom -> likelihood")
    remedies = []
    for i, item in enumerate(raw.get("remedies") or []):
        action_name = _need(item, "action", f"{where} remedy {i}", str)
        try:
            action = ActionKind(action_name)
        except ValueError:
            raise VigilInputError(f"{where} remedy {i}: action {action_name!r} is not on the whitelist") from None
        remedies.append(Remedy(action, str(item.get("target", "node")), str(item.get("risk", "low")),
                               str(item.get("why", ""))))
    return Fault(
        name=name,
        entity_kinds=tuple(str(k) for k in kinds),
        level=level,
        title=str(raw.get("title", name)),
        causes=tuple(str(c) for c in raw.get("causes") or ()),
        symptoms={str(k): float(v) for k, v in symptoms.items()},
        remedies=tuple(remedies),
        spread=raw.get("spread"),
        pseudo_count=float(raw.get("pseudo_count", 0)),
    )


def _external_signatures(aliases: dict[str, str]) -> tuple[list[Signature], list[str]]:
    """Signatures of the log-intelligence package (vigil/logs/signatures.py) when it is installed; a broken
    library there is reported as a problem, never fatal here."""
    try:
        from vigil.logs import signatures as log_signatures
    except ImportError:
        return [], []
    loader = getattr(log_signatures, "load_signatures", None)
    if loader is None:
        return [], []
    try:
        items = list(loader())
    except (VigilInputError, ValueError, OSError) as err:
        return [], [f"vigil/logs signatures not merged: {err}"]
    found = []
    for item in items:
        name = getattr(item, "name", None) or getattr(item, "id", None)
        pattern = getattr(item, "pattern", None) or getattr(item, "regex", None)
        if not name or not pattern:
            continue
        fault_type = getattr(item, "fault_type", None)
        alias = aliases.get(str(fault_type))
        if alias is None:
            continue
        try:
            compiled = pattern if isinstance(pattern, re.Pattern) else re.compile(str(pattern), re.IGNORECASE)
        except re.error as err:
            return [], [f"vigil/logs signature {name!r} not merged: bad regular expression ({err})"]
        found.append(Signature(f"sig_{name}", compiled, str(getattr(item, "description", "")), fault_type, alias))
    return found, []


def load_kb(directory: Path | None = None, include_external: bool = True) -> KnowledgeBase:
    """Read and cross-check the knowledge base; structural errors raise VigilInputError naming the file."""
    if directory is None:
        base = Path(str(resources.files("vigil.knowledge.data").joinpath("kb")))
        source = "package"
    else:
        base, source = directory, str(directory)
    raw = {name: _read_yaml(base, name) for name in KB_FILES}
    versions = {name.removesuffix(".yaml"): int(data["version"]) for name, data in raw.items()}

    fault_map = _need(raw["faults.yaml"], "faults", str(base / "faults.yaml"), dict)
    faults = {str(n): _parse_fault(str(n), v, str(base / "faults.yaml")) for n, v in fault_map.items()}

    signatures: dict[str, Signature] = {}
    where = str(base / "signatures.yaml")
    for name, item in _need(raw["signatures.yaml"], "signatures", where, dict).items():
        pattern = _need(item, "pattern", f"{where}: signature {name!r}", str)
        try:
            compiled = re.compile(pattern, re.IGNORECASE)
        except re.error as err:
            raise VigilInputError(f"{where}: signature {name!r}: bad regular expression ({err})") from None
        signatures[str(name)] = Signature(str(name), compiled, str(item.get("meaning", "")), item.get("fault"))
    external_problems: list[str] = []
    if include_external:
        aliases = {str(k): str(v) for k, v in (raw["signatures.yaml"].get("external_aliases") or {}).items()}
        for their_type, ours in aliases.items():
            if ours not in signatures:
                raise VigilInputError(f"{where}: external_aliases: {their_type!r} -> unknown signature {ours!r}")
        external, external_problems = _external_signatures(aliases)
        for signature in external:
            signatures.setdefault(signature.name, signature)

    xids: dict[int, XidEntry] = {}
    where = str(base / "xid.yaml")
    for code, item in _need(raw["xid.yaml"], "xids", where, dict).items():
        xids[int(code)] = XidEntry(int(code), str(item.get("mnemonic", "")),
                                   FaultLevel.parse(str(item.get("level", "drain"))),
                                   str(_need(item, "fault", f"{where}: xid {code}", str)))

    where = str(base / "trace.yaml")
    trace = [TraceClass(str(t["level"]), str(t["class"]), str(t["desc"]), int(t["count"]), t.get("fault"))
             for t in _need(raw["trace.yaml"], "classes", where, list)]

    templates: dict[ActionKind, tuple[str, str]] = {}
    where = str(base / "actions.yaml")
    for name, item in _need(raw["actions.yaml"], "actions", where, dict).items():
        try:
            action = ActionKind(name)
        except ValueError:
            raise VigilInputError(f"{where}: action {name!r} is not in vigil.model.ActionKind") from None
        templates[action] = (str(item.get("target", "any")), str(_need(item, "command", f"{where}: {name}", str)))

    findings = frozenset(str(f) for f in raw["faults.yaml"].get("findings") or ())
    kb = KnowledgeBase(versions, faults, signatures, xids, trace, templates, findings=findings, source=source)
    kb.problems = validate_kb(kb)
    kb.warnings = external_problems
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
    if prefix == "log" and rest not in kb.signatures:
        return f"symptom {symptom!r} names an unknown log signature"
    if prefix == "xid" and (not rest.isdigit() or int(rest) not in kb.xids):
        return f"symptom {symptom!r} names an Xid that is not in xid.yaml"
    return None


def simulator_fault_types() -> list[str]:
    """Fault types of the simulator's catalogue: each must have a knowledge entry."""
    from vigil.sources.sim.faults import CATALOGUE

    return sorted(spec.name for spec in CATALOGUE)


def validate_kb(kb: KnowledgeBase, expected_faults: Iterable[str] | None = None) -> list[str]:
    """Cross-references that YAML structure alone cannot check; empty list = valid."""
    problems = []
    for fault in kb.faults.values():
        for kind in fault.entity_kinds:
            if kind not in ENTITY_KINDS:
                problems.append(f"faults.yaml: {fault.name}: unknown entity kind {kind!r}")
        for symptom, likelihood in fault.symptoms.items():
            problem = _symptom_problem(symptom, kb)
            if problem:
                problems.append(f"faults.yaml: {fault.name}: {problem}")
            if not 0.0 < likelihood <= 1.0:
                problems.append(f"faults.yaml: {fault.name}: likelihood of {symptom!r} must be in (0, 1]")
        if not fault.remedies:
            problems.append(f"faults.yaml: {fault.name}: no remedies")
        for remedy in fault.remedies:
            if remedy.on not in ENTITY_KINDS:
                problems.append(f"faults.yaml: {fault.name}: remedy target kind {remedy.on!r} is unknown")
            if remedy.risk not in ("low", "medium", "high"):
                problems.append(f"faults.yaml: {fault.name}: remedy risk {remedy.risk!r} is not low/medium/high")
        if fault.spread not in (None, "children"):
            problems.append(f"faults.yaml: {fault.name}: spread must be 'children' or absent")
    for entry in kb.xids.values():
        if entry.fault not in kb.faults:
            problems.append(f"xid.yaml: xid {entry.code}: unknown fault type {entry.fault!r}")
    for item in kb.trace:
        if item.fault is not None and item.fault not in kb.faults:
            problems.append(f"trace.yaml: class {item.desc!r}: unknown fault type {item.fault!r}")
    missing_actions = set(ActionKind) - set(kb.action_templates)
    if missing_actions:
        problems.append(f"actions.yaml: no command template for {sorted(a.value for a in missing_actions)}")
    for name in expected_faults if expected_faults is not None else simulator_fault_types():
        if name not in kb.faults:
            problems.append(f"faults.yaml: simulator fault type {name!r} has no knowledge entry")
    return problems


# --------------------------------------------------------------------------- seeding


def seed_xid_yaml(out: Path) -> int:
    """Write xid.yaml from the Xid catalogue table (vigil.detect.xid); returns the number of codes."""
    from vigil.detect.xid import known_xids, xid_info

    lines = [
        "# Generated by `python -m vigil.diagnose.kb seed-xid` from vigil/knowledge/data/xid_levels.csv (NVIDIA Xid",
        "# catalogue); edit XID_PRIMARY_FAULT in vigil/diagnose/kb.py, not this file.",
        "version: 1",
        "xids:",
    ]
    codes = known_xids()
    for code in codes:
        info = xid_info(code)
        fault = XID_PRIMARY_FAULT.get(code, "gpu_xid")
        mnemonic = info.mnemonic.replace("'", "")
        lines.append(f"  {code}: {{mnemonic: '{mnemonic}', level: {info.level.label}, fault: {fault}}}")
    out.write_text("\n".join(lines) + "\n")
    return len(codes)


if __name__ == "__main__":
    if sys.argv[1:] != ["seed-xid"]:
        raise SystemExit("usage: python -m vigil.diagnose.kb seed-xid")
    target = Path(__file__).resolve().parents[1] / "knowledge" / "data" / "kb" / "xid.yaml"
    print(f"wrote {seed_xid_yaml(target)} Xid codes to {target}")
