"""Training ranks' log lines -> events: the lines THE log-signature library names, one event each.

Whatever ships a rank's output (a log forwarder on the node pushing to ``POST /api/v1/events``, ``vigil launch
--server`` following its ranks' log files and sending the events in its reports, ``vigil.run.report``, a
replayed capture) hands each line here with the rank it came from and pushes the events; the engine's
detectors read them like any other event. A line is an event of kind ``rank_log`` on the rank, with the
signature's id and symptom, and - for a collective the watchdog timed out - the collective's sequence number,
operation and process group, so peers' reports of the same collective can be compared. Nothing is judged
here. A line under a launcher's prefix (torch's ``[rank3]: ValueError: ...``, the form uncaught errors of
distributed ranks take, Ray's ``(RayTrainWorker pid=N)``, mpirun's ``[1,3]<stderr>:``: see
:mod:`vigil.knowledge.line_prefix`) is matched without that prefix when it does not match with it, as
``vigil logs`` reads it.
"""

from __future__ import annotations

import re
from functools import lru_cache

from vigil.knowledge.line_prefix import split_prefix
from vigil.knowledge.signatures import SignatureMatcher
from vigil.model import Event

SOURCE = "rank"
# ProcessGroupNCCL's prefix on its own lines: "[PG ID 0 PG GUID 0(default_pg) Rank 3]" (torch >= 2.4), or the
# older "[PG 0 (default_pg) Rank 3]"; a SeqNum counts within its process group.
_PROCESS_GROUP = re.compile(r"\[PG (?:ID )?(?P<pg>\d+)\b")
# The sequence number a watchdog line names, under the signature library's group names.
_SEQ_GROUPS = ("seq", "timeout_work", "work")


@lru_cache(maxsize=1)
def _matcher() -> SignatureMatcher:
    return SignatureMatcher()


def decode_rank_line(rank: str, line: str, ts: float) -> Event | None:
    """The event one line of ``rank``'s log (a rank entity id) reports, or None for a line no signature names."""
    hit = _matcher().match(line)
    if hit is None:
        prefix = split_prefix(line)
        hit = _matcher().match(prefix.payload) if prefix is not None else None
    if hit is None:
        return None
    attrs: dict[str, object] = {"signature": hit.signature.id}
    if hit.signature.symptom:
        attrs["symptom"] = hit.signature.symptom
    seq = next((hit.attrs[g] for g in _SEQ_GROUPS if str(hit.attrs.get(g, "")).isdigit()), None)
    if seq is not None:
        attrs["seq"] = int(seq)
        if hit.attrs.get("op"):
            attrs["op"] = str(hit.attrs["op"])
        group = _PROCESS_GROUP.search(line)
        if group is not None:
            attrs["process_group"] = group.group("pg")
    return Event(ts=ts, entity=rank, kind="rank_log", source=SOURCE, level=hit.level, message=line[:8192],
                 attrs=attrs)
