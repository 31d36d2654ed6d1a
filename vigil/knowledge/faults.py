"""THE fault catalogue (``data/kb/faults.yaml`` + the real trace's counts in ``data/kb/trace.yaml``).

One entry per fault type: the entity kinds it lives on, its fault level, causes, symptoms with
P(symptom | fault), remedies from the action whitelist, and its weight. Detector findings (symptoms that
are not root causes, such as ``job_crash``) carry their level here too, so every stage that names a fault
or a finding takes its level from one place.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from vigil.knowledge.files import kb_dir, read_data
from vigil.model import ActionKind, FaultLevel, VigilInputError

ENTITY_KINDS = ("gpu", "node", "nic", "switch", "rack", "job", "rank", "cluster")


def _level(value: object) -> FaultLevel:
    if isinstance(value, FaultLevel):
        return value
    if isinstance(value, str | int):
        return FaultLevel.parse(value)
    raise ValueError(f"bad fault level {value!r}")


class RemedyEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    action: ActionKind
    target: str = "node"
    risk: Literal["low", "medium", "high"] = "low"
    why: str = ""

    @field_validator("action", mode="before")
    @classmethod
    def _whitelisted(cls, value: object) -> object:
        if isinstance(value, str) and value not in {a.value for a in ActionKind}:
            raise ValueError(f"action {value!r} is not on the whitelist")
        return value


class FaultEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entity: list[str] = Field(min_length=1)
    level: FaultLevel
    title: str
    causes: list[str] = Field(default_factory=list)
    symptoms: dict[str, float] = Field(default_factory=dict)
    remedies: list[RemedyEntry] = Field(default_factory=list)
    spread: Literal["children"] | None = None
    pseudo_count: float = Field(default=0.0, ge=0.0)

    _parse_level = field_validator("level", mode="before")(_level)

    @property
    def target(self) -> str:
        """The entity kind the fault is injected on and reported against."""
        return self.entity[0]


class FindingEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    level: FaultLevel
    title: str

    _parse_level = field_validator("level", mode="before")(_level)


class FaultFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int
    findings: dict[str, FindingEntry] = Field(default_factory=dict)
    faults: dict[str, FaultEntry]


class TraceClass(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    level: str
    cls: str = Field(alias="class")
    desc: str
    count: int = Field(ge=0)
    fault: str | None = None


class TraceFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int
    source: str
    classes: list[TraceClass]


class FaultCatalogue(BaseModel):
    """The loaded catalogue: faults, findings and the real trace's classes."""

    versions: dict[str, int]
    faults: dict[str, FaultEntry]
    findings: dict[str, FindingEntry]
    trace: list[TraceClass]

    def level(self, name: str) -> FaultLevel:
        """The level of a fault type or a finding; an unknown name is a programming error in a detector."""
        if name in self.faults:
            return self.faults[name].level
        if name in self.findings:
            return self.findings[name].level
        raise VigilInputError(f"{name!r} is neither a fault type nor a finding of the fault catalogue")

    def trace_count(self, name: str) -> int:
        return sum(t.count for t in self.trace if t.fault == name)

    def weight(self, name: str) -> float:
        """How often the fault happens, relative to the others: its count in the real trace plus its pseudo-count."""
        return self.trace_count(name) + self.faults[name].pseudo_count

    def problems(self) -> list[str]:
        """Cross-references a single file's schema cannot check; empty = consistent."""
        out = []
        for name, fault in self.faults.items():
            if name in self.findings:
                out.append(f"faults.yaml: {name!r} is both a fault and a finding")
            for kind in fault.entity:
                if kind not in ENTITY_KINDS:
                    out.append(f"faults.yaml: {name}: unknown entity kind {kind!r}")
            for remedy in fault.remedies:
                if remedy.target not in ENTITY_KINDS:
                    out.append(f"faults.yaml: {name}: remedy target kind {remedy.target!r} is unknown")
            if not fault.remedies:
                out.append(f"faults.yaml: {name}: no remedies")
            for symptom, likelihood in fault.symptoms.items():
                if not 0.0 < likelihood <= 1.0:
                    out.append(f"faults.yaml: {name}: likelihood of {symptom!r} must be in (0, 1]")
        for item in self.trace:
            if item.fault is not None and item.fault not in self.faults:
                out.append(f"trace.yaml: class {item.desc!r}: unknown fault type {item.fault!r}")
        return out


def load_fault_catalogue(directory: Path | None = None) -> FaultCatalogue:
    """Read ``faults.yaml`` and ``trace.yaml`` from ``directory`` (the shipped knowledge base by default)."""
    base = directory or kb_dir()
    faults = read_data(base / "faults.yaml", FaultFile, "knowledge base file")
    trace = read_data(base / "trace.yaml", TraceFile, "knowledge base file")
    return FaultCatalogue(versions={"faults": faults.version, "trace": trace.version}, faults=faults.faults,
                          findings=faults.findings, trace=trace.classes)


@lru_cache(maxsize=1)
def fault_catalogue() -> FaultCatalogue:
    return load_fault_catalogue()


def fault_level(name: str) -> FaultLevel:
    """The level of a fault type or finding, from the shipped catalogue."""
    return fault_catalogue().level(name)
