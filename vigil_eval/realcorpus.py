"""The corpus of real failure logs from public issue threads (tests/fixtures/logs/real), and triage's score on it.

Each case is a small directory of excerpts (a job log, a node's dmesg) with its source, its root line and why
that line is the root (``index.yaml``). The split into development and held-out cases is fixed by the case id
and its collection round alone (:func:`split_of`), so it was decided before any result was seen; triage's rules are
tuned on the development part only, and the held-out part is reported separately.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from vigil.logs.triage import TriageResult, triage

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "fixtures" / "logs" / "real"
Split = Literal["development", "held_out"]


HELD_OUT_ROUNDS_FROM = 3  # collection rounds 3-5 are held out whole, to grow the part nobody tuned on
HALVED_ROUNDS_FROM = 6  # from the sixth round on, each round is split in half: one half to tune on, one held out


def split_of(case_id: str, batch: int = 1) -> Split:
    """Rounds 1-2: held out when the SHA-256 of the id is divisible by 3 (about a third). Rounds 3-5: held out whole.
    Round 6 on: held out when the SHA-256 of the id is even (about half), so a new round both shows what triage
    misses (its development half) and measures the fixes on cases nobody looked at (its held-out half)."""
    digest = int(hashlib.sha256(case_id.encode()).hexdigest(), 16)
    if batch >= HALVED_ROUNDS_FROM:
        return "held_out" if digest % 2 == 0 else "development"
    if batch >= HELD_OUT_ROUNDS_FROM:
        return "held_out"
    return "held_out" if digest % 3 == 0 else "development"


@dataclass(frozen=True)
class RealCase:
    id: str
    source: str
    category: str
    split: Split
    directory: Path
    root_file: str
    root_line: int
    also_lines: tuple[int, ...]
    why: str
    batch: int = 1  # the collection round that added the case (the held-out parts of each are reported apart)
    moved_to_development: str | None = None  # why a held-out case was moved (a generic gap it showed was fixed)

    def accepts(self, result: TriageResult) -> bool:
        root = result.root
        return (root is not None and root.source == self.root_file
                and (root.lineno == self.root_line or root.lineno in self.also_lines))


def load_cases(corpus: Path = CORPUS) -> list[RealCase]:
    """Every case of the index, checked: the split recorded there must be the one :func:`split_of` gives."""
    entries = yaml.safe_load((corpus / "index.yaml").read_text(encoding="utf-8"))
    cases = []
    for entry in entries:
        split = split_of(entry["id"], int(entry.get("batch", 1)))
        if entry.get("moved_to_development"):  # measured held out once, then tuned on: development from then on
            split = "development"
        if entry["split"] != split:
            raise ValueError(f"{corpus / 'index.yaml'}: case {entry['id']!r} says split {entry['split']!r}, "
                             f"the rule gives {split!r}")
        cases.append(RealCase(
            id=entry["id"], source=entry["source"], category=entry["category"], split=split,
            directory=corpus / entry["id"], root_file=entry["root"]["file"], root_line=int(entry["root"]["line"]),
            also_lines=tuple(int(n) for n in entry.get("also_lines", ())), why=entry["why"],
            batch=int(entry.get("batch", 1)), moved_to_development=entry.get("moved_to_development"),
        ))
    return cases


@dataclass(frozen=True)
class CaseOutcome:
    case: RealCase
    right: bool
    named: str | None  # file:line triage named as the root, None when it named none
    basis: str | None  # what named it (TriageResult.root_basis)


def evaluate(cases: list[RealCase]) -> Iterator[CaseOutcome]:
    for case in cases:
        result = triage(case.directory, job=case.id, workers=1)
        named = None if result.root is None else f"{result.root.source}:{result.root.lineno}"
        yield CaseOutcome(case, case.accepts(result), named, result.root_basis)
