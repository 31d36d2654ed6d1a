"""What renumbering a moved store costs (Store.renumber_moved: the engine's read position saved on another
PostgreSQL server, its rows renumbered once), against a plain full-table read of the same table in the same run.

Run: .venv/bin/python bench/renumber.py [--sizes 100000 1000000]   -> bench/results/renumber.json

A throwaway PostgreSQL server (Debian's binaries, as the tests start one), a fresh database a size, the events table
filled with N rows as a restore leaves them (xids of the old server, a billion on, ten rows a transaction) and the
read position half way. Measured per size: the baseline (every row of the table read by one SELECT, fetched), the
renumbering alone, then - the rows restored again - the renumbering with other writers beside it: an INSERT of an
event (an agent's push) and a DELETE of the table's last row (retention), each started 50 ms into it; the outcome
(a renumbering in one REPEATABLE READ transaction failed with a serialization failure once such a row was
deleted) and how long each writer took. The table's size before and after (the UPDATE writes a new version of
every row it changes).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.serve.conftest import fresh_database, running_postgres  # noqa: E402
from vigil.store.sql import ReadPosition, Store  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "renumber.json"
OLD = 10**9


def _plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _timed(conn_url: str, sql: str, started: threading.Event, out: dict[str, float], name: str) -> None:
    started.wait()
    time.sleep(0.05)  # into the renumbering, not before it
    with psycopg.connect(conn_url, autocommit=True) as conn:
        began = time.perf_counter()
        conn.execute(sql)
        out[name] = time.perf_counter() - began


def measure(server: str, rows: int) -> dict[str, float | int]:
    url = fresh_database(server, f"renumber_{rows}")
    store = Store(url)
    with psycopg.connect(_plain(url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO events (ts, entity, kind, source, level, message, attrs, xid) "
            "SELECT i, 'gpu/n' || (i %% 1000) || '/' || (i %% 8), 'xid', 'kernel', 3, "
            "'NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.', '{\"xid\": 79}'::json, %s + i / 10 "
            "FROM generate_series(1, %s) AS i", (OLD, rows))
        conn.execute("VACUUM ANALYZE events")
        size_before = int(conn.execute("SELECT pg_total_relation_size('events')").fetchone()[0])
        began = time.perf_counter()
        with conn.cursor() as cur:
            cur.execute("SELECT * FROM events")
            fetched = len(cur.fetchall())
        baseline_s = time.perf_counter() - began
    assert fetched == rows
    position = ReadPosition(OLD + rows // 20, rows // 2)
    began = time.perf_counter()
    moved = store.renumber_moved("events", position)
    renumber_s = time.perf_counter() - began
    assert moved is not None and moved[0] == ReadPosition(0, rows // 2)
    with psycopg.connect(_plain(url), autocommit=True) as conn:
        size_after = int(conn.execute("SELECT pg_total_relation_size('events')").fetchone()[0])
        read, unread = conn.execute("SELECT count(*) FILTER (WHERE xid = 0), count(*) FILTER (WHERE xid = 1) "
                                    "FROM events").fetchone()
        # as restored again, for the run with writers beside it
        conn.execute("UPDATE events SET xid = %s + id / 10", (OLD,))
        conn.execute("VACUUM ANALYZE events")
    started, waits = threading.Event(), {}
    others = [threading.Thread(target=_timed, args=(_plain(url), sql, started, waits, name)) for name, sql in (
        ("insert_s", "INSERT INTO events (ts, entity, kind, source, level, message, attrs) "
                     "VALUES (0, 'gpu/n1/0', 'xid', 'kernel', 3, 'pushed meanwhile', '{}')"),
        ("delete_s", f"DELETE FROM events WHERE id = {rows}"))]
    for thread in others:
        thread.start()
    began = time.perf_counter()
    started.set()
    outcome = "committed"
    try:
        store.renumber_moved("events", position)
    except Exception as err:  # what a writer beside it makes of a one-transaction renumbering
        outcome = type(getattr(err, "orig", err)).__name__
    beside_s = time.perf_counter() - began
    for thread in others:
        thread.join()
    store.close()
    return {"rows": rows, "full_read_s": round(baseline_s, 3), "renumber_s": round(renumber_s, 3),
            "renumber_over_read": round(renumber_s / baseline_s, 2),
            "with_writers_s": round(beside_s, 3), "with_writers_outcome": outcome,
            "insert_meanwhile_s": round(waits["insert_s"], 3), "delete_meanwhile_s": round(waits["delete_s"], 3),
            "table_mb_before": round(size_before / 2**20, 1), "table_mb_after": round(size_after / 2**20, 1),
            "rows_read_xid0": int(read), "rows_unread_xid1": int(unread)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    args = parser.parse_args()
    with running_postgres() as (server, _base):
        runs = [measure(server, rows) for rows in args.sizes]
    columns = list(runs[0])
    print(" ".join(f"{c:>20s}" for c in columns))
    for run in runs:
        print(" ".join(f"{run[c]!s:>20s}" for c in columns))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"method": (__doc__ or "").split("Run:")[0].strip(), "runs": runs}, indent=1)
                       + "\n")


if __name__ == "__main__":
    main()
