"""What writing each samples push to the agent's spool before it is sent costs, against a server that takes every
push (the healthy case, where nothing was written before).

Run: .venv/bin/python bench/push_spool.py   -> bench/results/push_spool.json

An EventPusher with its spool (SQLite, WAL, synchronous=FULL) in a temp directory of this machine's disk sends push
rounds of a node's samples (368: eight GPUs' metrics and the host's, a 28 KB body) to an HTTP transport answering
201 at once, so the round's time is the agent's own. Per round: the write before sending (one fsynced transaction)
and the removal on the 2xx (another), and the whole round, against rounds of the same run with no spool (what a
push cost before). Rounds alternate between the two, so that a disk slowed for a while slows both alike.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from vigil.model import Sample
from vigil.sources.collect.agent import EventPusher
from vigil.sources.collect.spool import EventSpool

RESULTS = Path(__file__).resolve().parent / "results" / "push_spool.json"
ROUNDS = 300
SAMPLES = 368


def pusher(spool: EventSpool | None) -> EventPusher:
    made = EventPusher("http://vigil.test")
    made._client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(201, json={"stored": 1})))
    if spool is not None:
        made.attach_spool(spool.samples(24, 4 * 2**20))
    return made


def timed(method: Any, into: list[float]) -> Any:
    def call(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*args)
        finally:
            into.append(time.perf_counter() - start)
    return call


def summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"median_ms": round(1e3 * statistics.median(ordered), 3),
            "p90_ms": round(1e3 * ordered[int(0.9 * len(ordered))], 3),
            "p99_ms": round(1e3 * ordered[int(0.99 * len(ordered))], 3),
            "max_ms": round(1e3 * ordered[-1], 3)}


def main() -> None:
    samples = [Sample(ts=1.0, entity=f"gpu/n01/{i % 8}" if i < 320 else "node/n01",
                      metric=f"vigil_gpu_metric_{i // 8}" if i < 320 else f"vigil_node_metric_{i}", value=float(i))
               for i in range(SAMPLES)]
    with tempfile.TemporaryDirectory() as tmp:
        spool = EventSpool(Path(tmp), 10_000, 32 * 2**20)
        durable, memory = pusher(spool), pusher(None)
        writes: list[float] = []
        removals: list[float] = []
        persist = durable._persist
        durable._persist = timed(persist, writes)  # type: ignore[method-assign]
        durable._unspool = timed(durable._unspool, removals)  # type: ignore[method-assign]
        rounds: dict[str, list[float]] = {"spooled": [], "memory": []}
        for _ in range(ROUNDS):
            for name, made in (("spooled", durable), ("memory", memory)):
                start = time.perf_counter()
                made._round([], samples, "n01", None)
                rounds[name].append(time.perf_counter() - start)
                assert not made.backlog
        body = len(json.dumps({"node": "n01", "samples": [s.model_dump(mode="json") for s in samples]},
                              separators=(",", ":")))
        spool.close()
    result = {"rounds": ROUNDS, "samples_per_push": SAMPLES, "push_bytes": body,
              "write_before_send": summary(writes), "removal_on_2xx": summary(removals),
              "round_spooled": summary(rounds["spooled"]), "round_memory": summary(rounds["memory"]),
              "added_per_round_median_ms": round(1e3 * (statistics.median(rounds["spooled"])
                                                        - statistics.median(rounds["memory"])), 3)}
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
