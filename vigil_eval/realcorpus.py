"""The corpus of real failure logs from public issue threads (tests/fixtures/logs/real), and triage's score on it.

Each case is a small directory of excerpts (a job log, a node's dmesg) with its source, its root line and why
that line is the root (``index.yaml``). The split into development and held-out cases is fixed by the case id
and its collection round alone (:func:`split_of`), so it was decided before any result was seen; triage's rules are
tuned on the development part only, and the held-out part is reported separately.
"""

from __future__ import annotations

import hashlib
import statistics
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from vigil.logs.severity import strength
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

    def is_root(self, source: str, lineno: int) -> bool:
        """Whether line ``lineno`` of ``source`` is the labelled root (or one of the lines also accepted)."""
        return source == self.root_file and (lineno == self.root_line or lineno in self.also_lines)

    def accepts(self, result: TriageResult) -> bool:
        root = result.root
        return root is not None and self.is_root(root.source, root.lineno)


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


def naive_root(case: RealCase, last: bool = False) -> tuple[str, int] | None:
    """The baseline: the first (or last) line of the case's files whose wording reads as an error."""
    found = [(path.name, n) for path in sorted(case.directory.iterdir())
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if strength(line)]
    return (found[-1] if last else found[0]) if found else None


def part_of(case: RealCase) -> str:
    """The row a case is reported in: development, or the held-out part of the rounds before the sixth (``held_out,
    rounds 1-5``) or of the sixth round on (``held_out, round 6``)."""
    if case.split == "development":
        return "development"
    return "held_out, rounds 1-5" if case.batch < HALVED_ROUNDS_FROM else f"held_out, round {case.batch}"


def _part_order(part: str) -> tuple[int, int]:
    """Development first, then the held-out part of rounds 1-5, then each later round's held-out half."""
    if part == "development":
        return (0, 0)
    return (1, 0) if part.endswith("rounds 1-5") else (2, int(part.rsplit(" ", 1)[-1]))


SCORERS = ("vigil", "vigil_signatures_only", "first_error_line", "last_error_line")


def score_corpus(cases: list[RealCase] | None = None) -> dict[str, object]:
    """Triage and the two line baselines on every case, in one run: right counts per split, per reported part and per
    held-out round, and the development misses by id (held-out misses are not listed: nobody tunes on them)."""
    rows: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    parts: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    by_batch: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    misses: list[str] = []
    for outcome in evaluate(load_cases() if cases is None else cases):
        case = outcome.case
        right = {"vigil": outcome.right, "vigil_signatures_only": outcome.right and outcome.basis == "signature"}
        for name, last in (("first_error_line", False), ("last_error_line", True)):
            found = naive_root(case, last)
            right[name] = found is not None and case.is_root(*found)
        for name in SCORERS:
            rows[case.split][name].append(int(right[name]))
            parts[part_of(case)][name].append(int(right[name]))
            if case.split == "held_out":
                by_batch[case.batch][name].append(int(right[name]))
        if case.split == "development" and not outcome.right:
            misses.append(case.id)

    def counted(table: dict[str, list[int]]) -> dict[str, object]:
        return {"cases": len(table["vigil"]), "right": {k: sum(v) for k, v in table.items()}}

    return {
        "cases": {split: len(v["vigil"]) for split, v in rows.items()},
        "accuracy": {split: {name: statistics.fmean(values) for name, values in v.items()}
                     for split, v in rows.items()},
        "right": {split: {name: sum(values) for name, values in v.items()} for split, v in rows.items()},
        "parts": {part: counted(parts[part]) for part in sorted(parts, key=_part_order)},
        "development_misses": misses,
        "held_out_by_batch": {str(b): counted(v) for b, v in sorted(by_batch.items())},
    }


def table_rows(scored: dict[str, object]) -> list[tuple[str, ...]]:
    """``score_corpus``'s result as table rows: each part, then every held-out case together (never tuned on)."""
    parts: dict[str, dict[str, object]] = scored["parts"]  # type: ignore[assignment]
    rows = []
    for name, part in parts.items():
        right: dict[str, int] = part["right"]  # type: ignore[assignment]
        rows.append((name.replace("_", "-"), str(part["cases"]),
                     *(f"{right[k]}/{part['cases']}" for k in SCORERS)))
    cases: dict[str, int] = scored["cases"]  # type: ignore[assignment]
    right_all: dict[str, dict[str, int]] = scored["right"]  # type: ignore[assignment]
    if "held_out" in cases:
        n = cases["held_out"]
        rows.append(("held-out, together", str(n), *(f"{right_all['held_out'][k]}/{n}" for k in SCORERS)))
    return rows


TABLE_COLUMNS = ("part", "cases", "vigil", "vigil, signatures only", "first error line", "last error line")
