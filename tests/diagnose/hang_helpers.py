"""Build op records by hand for the hang-analysis tests."""

from __future__ import annotations

from vigil.sources.probe.records import COLLECTIVE, OpRecord


def coll(
    seq: int,
    state: str = "completed",
    op: str = "all_reduce",
    numel: int = 64,
    t_start: float = 100.0,
    duration: float | None = 0.01,
    ranks: tuple[int, ...] = (0, 1, 2, 3),
    group: str = "0",
) -> OpRecord:
    done = state == "completed"
    return OpRecord(
        record_id=seq,
        group=group,
        group_ranks=list(ranks),
        kind=COLLECTIVE,
        seq=seq,
        op=op,
        sizes=[[numel]],
        dtypes=["float32"],
        state=state,
        t_start=t_start,
        t_end=t_start + (duration or 0.0) if done else None,
    )
