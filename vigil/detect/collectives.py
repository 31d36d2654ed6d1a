"""Cross-rank collective matching by consensus: who never entered collective #k, who differs.

Unlike torch's FR analyzer, no rank is the reference: every question ("which op is #k", "what shape
should it have") is answered by the majority of the group's members, and time decides order.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from vigil.sources.probe.records import COLLECTIVE, OpRecord


@dataclass
class CollectiveFinding:
    """The state of the first unfinished collective of one process group."""

    group: str
    seq: int
    op: str
    members: list[int]
    completed: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    mismatched: dict[int, str] = field(default_factory=dict)
    skipped: list[int] = field(default_factory=list)
    oldest_wait_s: float = 0.0

    def describe(self) -> str:
        parts = [f"group {self.group!r} collective #{self.seq} ({self.op}):"]
        if self.waiting:
            parts.append(f"ranks {self.waiting} entered and wait")
        if self.missing:
            parts.append(f"ranks {self.missing} never entered")
        for rank, what in sorted(self.mismatched.items()):
            parts.append(f"rank {rank} differs: {what}")
        return " ".join(parts)


def collective_ops(ops_by_rank: dict[int, list[OpRecord]]) -> dict[str, dict[int, dict[int, OpRecord]]]:
    """group -> rank -> seq -> op, collectives only."""
    table: dict[str, dict[int, dict[int, OpRecord]]] = defaultdict(lambda: defaultdict(dict))
    for rank, ops in ops_by_rank.items():
        for op in ops:
            if op.kind == COLLECTIVE:
                table[op.group][rank][op.seq] = op
    return table


def _members(group_table: dict[int, dict[int, OpRecord]]) -> list[int]:
    votes: Counter[tuple[int, ...]] = Counter()
    for ops in group_table.values():
        for op in ops.values():
            if op.group_ranks:
                votes[tuple(op.group_ranks)] += 1
    if votes:
        return list(votes.most_common(1)[0][0])
    return sorted(group_table)


def _describe_signature(op: OpRecord) -> str:
    shape = ", ".join(f"{list(s)}" for s in op.sizes) or "no tensor"
    dtype = ",".join(op.dtypes)
    root = f" root {op.root}" if op.root is not None else ""
    return f"{op.op} {shape} {dtype}{root}".strip()


def match_group(
    group: str, group_table: dict[int, dict[int, OpRecord]], now: float, members: list[int] | None = None
) -> CollectiveFinding | None:
    """The first collective of ``group`` that some member has in flight or failed, classified by rank."""
    members = members if members is not None else _members(group_table)
    unfinished = [
        op.seq
        for rank in members
        for op in group_table.get(rank, {}).values()
        if op.state != "completed"
    ]
    if not unfinished:
        return None
    seq = min(unfinished)
    entered = {rank: group_table[rank][seq] for rank in members if seq in group_table.get(rank, {})}
    majority, majority_count = Counter(op.signature() for op in entered.values()).most_common(1)[0]
    representative = next(op for op in entered.values() if op.signature() == majority)
    finding = CollectiveFinding(group=group, seq=seq, op=representative.op, members=members)
    for rank in members:
        op = entered.get(rank)
        if op is None:
            finding.missing.append(rank)
        elif op.state == "completed":
            finding.completed.append(rank)
        else:
            finding.waiting.append(rank)
            finding.oldest_wait_s = max(finding.oldest_wait_s, now - op.t_start)
    # Consensus needs a strict majority; with a tie nobody can be called the odd one out.
    if majority_count * 2 > len(entered):
        for rank, op in entered.items():
            if op.signature() != majority:
                finding.mismatched[rank] = (
                    f"{_describe_signature(op)} where the others have {_describe_signature(representative)}"
                )
                if _skipped_one(group_table, rank, seq, representative, op, members):
                    finding.skipped.append(rank)
    return finding


def _skipped_one(
    group_table: dict[int, dict[int, OpRecord]],
    rank: int,
    seq: int,
    expected: OpRecord,
    actual: OpRecord,
    members: list[int],
) -> bool:
    """True when the rank's op #k is what the others ran right after their op #k earlier on.

    Training loops repeat, so the majority's own history shows which op follows the expected one.
    """
    reference = next((r for r in members if r != rank and seq in group_table.get(r, {})), None)
    if reference is None:
        return False
    history = group_table[reference]
    for earlier in range(seq - 1, min(history, default=seq) - 1, -1):
        current = history.get(earlier)
        following = history.get(earlier + 1)
        if current is None or following is None:
            continue
        if current.signature() == expected.signature():
            return following.signature() == actual.signature()
    return False


def match_collectives(ops_by_rank: dict[int, list[OpRecord]], now: float) -> list[CollectiveFinding]:
    """One finding per process group that has an unfinished collective, oldest wait first."""
    findings = []
    for group, table in collective_ops(ops_by_rank).items():
        finding = match_group(group, table, now)
        if finding is not None:
            findings.append(finding)
    findings.sort(key=lambda f: -f.oldest_wait_s)
    return findings


def signature_mismatches(ops_by_rank: dict[int, list[OpRecord]], now: float) -> list[CollectiveFinding]:
    """Findings where every member entered collective #k but someone's shape, dtype or op differs."""
    return [
        f
        for f in match_collectives(ops_by_rank, now)
        if f.mismatched and not f.missing
    ]
