"""An incremental index of TensorBoard scalars, for comparing and merging runs fast.

``RunIndex(path).update(logdir)`` reads every ``events.out.tfevents.*`` file under ``logdir`` from where the
last update stopped (a byte offset per file) up to the last complete record, so a file still being written
is read again later from its last whole record; a record whose CRC does not match stops that file with a
warning, never the index. A run is a directory holding event files, named by its path under ``logdir``.

Scalars are stored per (run, tag) as chunks of numpy arrays in one SQLite file, so a query reads a few
blobs instead of many rows. Each event file is a *segment* of its run: when a job restarts from a
checkpoint into the same directory, or when runs are merged, a later segment's points replace the earlier
ones from its first step on, which is what the restarted job really computed.

The record framing (length, masked CRC32C of the length, data, masked CRC32C of the data) is read here
because TensorBoard's own reader cannot start at an offset; the Event protos are parsed by TensorBoard's
``event_pb2``.
"""

from __future__ import annotations

import json
import sqlite3
import struct
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import google_crc32c
import numpy as np

from vigil.model import VigilInputError

EVENT_GLOB = "events.out.tfevents.*"
_HEADER = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_COMPACT_AFTER = 16
PREVIEW_POINTS = (
    1000  # the board's default points per series  # chunks per (run, tag, segment) before they are merged into one
)


def masked_crc32c(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path: Path, offset: int) -> Iterator[tuple[bytes, int]]:
    """(record data, offset after it) for each complete, intact record from ``offset`` on."""
    with path.open("rb") as handle:
        handle.seek(offset)
        while True:
            header = handle.read(12)
            if len(header) < 12:
                return
            (length,) = _HEADER.unpack_from(header)
            if _CRC.unpack_from(header, 8)[0] != masked_crc32c(header[:8]):
                raise VigilInputError(f"TensorBoard file {path}: bad record header at byte {offset}")
            data = handle.read(length)
            footer = handle.read(4)
            if len(data) < length or len(footer) < 4:
                return  # a record still being written: read it next time
            if _CRC.unpack(footer)[0] != masked_crc32c(data):
                raise VigilInputError(f"TensorBoard file {path}: bad record data at byte {offset}")
            offset += 12 + length + 4
            yield data, offset


def _scalars_of(data: bytes) -> Iterator[tuple[str, int, float, float]]:
    from tensorboard.compat.proto import event_pb2

    event = event_pb2.Event.FromString(data)
    if not event.HasField("summary"):
        return
    for value in event.summary.value:
        if value.HasField("simple_value"):
            yield value.tag, event.step, event.wall_time, float(value.simple_value)
        elif value.HasField("tensor") and (value.tensor.float_val or value.tensor.double_val):
            scalar = value.tensor.float_val[0] if value.tensor.float_val else value.tensor.double_val[0]
            yield value.tag, event.step, event.wall_time, float(scalar)


@dataclass(frozen=True)
class RunInfo:
    name: str
    tags: list[str]
    points: int
    merged_from: list[str] | None


@dataclass(frozen=True)
class Series:
    """One run's points of one tag, sorted by step, restarts and merges resolved."""

    run: str
    tag: str
    steps: np.ndarray
    walls: np.ndarray
    values: np.ndarray

    def downsampled(self, points: int) -> Series:
        """At most ``points`` points, keeping each bucket's minimum and maximum (spikes stay visible)."""
        n = len(self.steps)
        if n <= points or points < 2:
            return self
        buckets = points // 2
        width = -(-n // buckets)
        padded = np.full(buckets * width, np.nan)
        padded[:n] = self.values
        rows = padded.reshape(buckets, width)
        # NaN never wins a bucket unless the whole bucket is NaN, then it stays visible as NaN.
        lows = np.where(np.isnan(rows), np.inf, rows).argmin(axis=1)
        highs = np.where(np.isnan(rows), -np.inf, rows).argmax(axis=1)
        base = np.arange(buckets) * width
        keep = np.unique(np.concatenate([base + lows, base + highs]))
        idx = keep[keep < n]
        return Series(self.run, self.tag, self.steps[idx], self.walls[idx], self.values[idx])


class RunIndex:
    """The scalars of every run under one or more log directories (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # One connection; a server's worker threads take turns (each query reads a few blobs).
        self.lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(path, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            with self.db:
                self.db.execute(
                    "CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, run TEXT NOT NULL, segment TEXT NOT"
                    " NULL, offset INTEGER NOT NULL, error TEXT)"
                )
                self.db.execute(
                    "CREATE TABLE IF NOT EXISTS chunks (run TEXT, tag TEXT, segment TEXT, seq INTEGER, n INTEGER,"
                    " steps BLOB, walls BLOB, vals BLOB, PRIMARY KEY (run, tag, segment, seq))"
                )
                self.db.execute("CREATE TABLE IF NOT EXISTS merged (name TEXT PRIMARY KEY, parts TEXT NOT NULL)")
                # Each indexed (run, tag) downsampled once when it changes, so the board's usual request reads
                # one small blob; first_wall keeps time alignment right.
                self.db.execute(
                    "CREATE TABLE IF NOT EXISTS previews (run TEXT, tag TEXT, points INTEGER, first_wall REAL,"
                    " steps BLOB, walls BLOB, vals BLOB, PRIMARY KEY (run, tag, points))"
                )
        except sqlite3.DatabaseError as err:
            raise VigilInputError(f"run index {path} is not a readable database: {err}") from None

    def close(self) -> None:
        self.db.close()

    # ---------------------------------------------------------------- indexing
    def update(self, logdir: Path, progress: Callable[[int, int], None] | None = None) -> dict[str, int]:
        """Read what is new in every event file under ``logdir``; returns new points per run."""
        if not logdir.is_dir():
            raise VigilInputError(f"log directory {logdir} "
                                  f"{'is not a directory' if logdir.exists() else 'does not exist'}")
        root = logdir.resolve()
        files = sorted(root.rglob(EVENT_GLOB))
        known = {row[0]: (row[1], row[2]) for row in self.db.execute("SELECT path, offset, error FROM files")}
        added: dict[str, int] = defaultdict(int)
        for i, path in enumerate(files):
            offset, error = known.get(str(path), (0, None))
            if error is None and path.stat().st_size > offset:
                run = str(path.parent.relative_to(root)) if path.parent != root else root.name
                added[run] += self._index_file(path, run, offset)
            if progress:
                progress(i + 1, len(files))
        self._refresh_previews([run for run, n in added.items() if n])
        return dict(added)

    def _refresh_previews(self, runs: Sequence[str]) -> None:
        with self.db:
            for run in runs:
                tags = [r[0] for r in self.db.execute("SELECT DISTINCT tag FROM chunks WHERE run = ?", (run,))]
                for tag in tags:
                    full = self.series(run, tag)
                    shown = full.downsampled(PREVIEW_POINTS)
                    self.db.execute(
                        "INSERT OR REPLACE INTO previews VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (
                            run,
                            tag,
                            PREVIEW_POINTS,
                            float(full.walls.min()),
                            shown.steps.tobytes(),
                            shown.walls.tobytes(),
                            shown.values.tobytes(),
                        ),
                    )

    def _preview(self, run: str, tag: str, points: int) -> tuple[Series, float] | None:
        row = self.db.execute(
            "SELECT first_wall, steps, walls, vals FROM previews WHERE run = ? AND tag = ? AND points = ?",
            (run, tag, points),
        ).fetchone()
        if row is None:
            return None
        steps, walls, values = (
            np.frombuffer(b, dtype=d) for b, d in zip(row[1:], (np.int64, np.float64, np.float64), strict=True)
        )
        return Series(run, tag, steps, walls, values), float(row[0])

    def _index_file(self, path: Path, run: str, offset: int) -> int:
        columns: dict[str, tuple[list[int], list[float], list[float]]] = defaultdict(lambda: ([], [], []))
        end, error = offset, None
        try:
            for data, after in read_records(path, offset):
                end = after
                for tag, step, wall, value in _scalars_of(data):
                    steps, walls, values = columns[tag]
                    steps.append(step)
                    walls.append(wall)
                    values.append(value)
        except VigilInputError as err:
            error = str(err)
        except Exception as err:  # protobuf raises its own DecodeError for a record that is not an Event
            error = f"TensorBoard file {path}: not an event record after byte {end}: {type(err).__name__}"
        segment = path.name
        with self.db:
            for tag, (steps, walls, values) in columns.items():
                seq = self.db.execute(
                    "SELECT COALESCE(MAX(seq), -1) + 1 FROM chunks WHERE run = ? AND tag = ? AND segment = ?",
                    (run, tag, segment),
                ).fetchone()[0]
                self.db.execute(
                    "INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        run,
                        tag,
                        segment,
                        seq,
                        len(steps),
                        np.asarray(steps, dtype=np.int64).tobytes(),
                        np.asarray(walls, dtype=np.float64).tobytes(),
                        np.asarray(values, dtype=np.float64).tobytes(),
                    ),
                )
                if seq + 1 >= _COMPACT_AFTER:
                    self._compact(run, tag, segment)
            self.db.execute(
                "INSERT INTO files VALUES (?, ?, ?, ?, ?) ON CONFLICT(path) DO UPDATE SET offset = excluded.offset,"
                " error = excluded.error",
                (str(path), run, segment, end, error),
            )
        return sum(len(c[0]) for c in columns.values())

    def _compact(self, run: str, tag: str, segment: str) -> None:
        steps, walls, values = self._segment_arrays(run, tag, segment)
        self.db.execute("DELETE FROM chunks WHERE run = ? AND tag = ? AND segment = ?", (run, tag, segment))
        self.db.execute(
            "INSERT INTO chunks VALUES (?, ?, ?, 0, ?, ?, ?, ?)",
            (run, tag, segment, len(steps), steps.tobytes(), walls.tobytes(), values.tobytes()),
        )

    def _segment_arrays(self, run: str, tag: str, segment: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = self.db.execute(
            "SELECT steps, walls, vals FROM chunks WHERE run = ? AND tag = ? AND segment = ? ORDER BY seq",
            (run, tag, segment),
        ).fetchall()
        return (
            np.concatenate([np.frombuffer(r[0], dtype=np.int64) for r in rows]),
            np.concatenate([np.frombuffer(r[1], dtype=np.float64) for r in rows]),
            np.concatenate([np.frombuffer(r[2], dtype=np.float64) for r in rows]),
        )

    # ---------------------------------------------------------------- merging
    def merge(self, name: str, parts: Sequence[str]) -> None:
        """A new run made of ``parts`` in order (e.g. a restarted job's segments); stored, never overwriting."""
        if not name or "\n" in name:
            raise VigilInputError(f"merged run name {name!r} is not a name")
        if len(parts) < 2:
            raise VigilInputError("a merge needs at least two runs")
        known = set(self.run_names())
        if name in known:
            raise VigilInputError(f"run {name!r} already exists; choose another name")
        missing = [p for p in parts if p not in known]
        if missing:
            raise VigilInputError(f"unknown run(s): {', '.join(missing)}")
        nested = [p for p in parts if self._parts(p) is not None]
        if nested:
            raise VigilInputError(f"merge the indexed runs themselves, not merged runs: {', '.join(nested)}")
        with self.db:
            self.db.execute("INSERT INTO merged VALUES (?, ?)", (name, json.dumps(list(parts))))

    def _parts(self, run: str) -> list[str] | None:
        row = self.db.execute("SELECT parts FROM merged WHERE name = ?", (run,)).fetchone()
        return json.loads(row[0]) if row else None

    # ---------------------------------------------------------------- queries
    def run_names(self) -> list[str]:
        indexed = [r[0] for r in self.db.execute("SELECT DISTINCT run FROM chunks ORDER BY run")]
        return indexed + [r[0] for r in self.db.execute("SELECT name FROM merged ORDER BY name")]

    def runs(self) -> list[RunInfo]:
        stats = self.db.execute("SELECT run, tag, SUM(n) FROM chunks GROUP BY run, tag ORDER BY run, tag").fetchall()
        by_run: dict[str, tuple[list[str], int]] = {}
        for run, tag, n in stats:
            tags, total = by_run.get(run, ([], 0))
            by_run[run] = ([*tags, tag], total + int(n))
        infos = [RunInfo(run, tags, total, None) for run, (tags, total) in by_run.items()]
        for name, parts_json in self.db.execute("SELECT name, parts FROM merged ORDER BY name"):
            parts = json.loads(parts_json)
            tags = sorted({t for p in parts for t in by_run.get(p, ([], 0))[0]})
            infos.append(RunInfo(name, tags, sum(by_run.get(p, ([], 0))[1] for p in parts), parts))
        return infos

    def series(self, run: str, tag: str) -> Series:
        """The run's points for ``tag``, sorted by step; later segments replace earlier ones from their first step."""
        parts = self._parts(run)
        segments: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for part in parts or [run]:
            names = [
                r[0]
                for r in self.db.execute(
                    "SELECT DISTINCT segment FROM chunks WHERE run = ? AND tag = ? ORDER BY segment", (part, tag)
                )
            ]
            segments.extend(self._segment_arrays(part, tag, s) for s in names)
        if not segments:
            if run not in self.run_names():
                raise VigilInputError(f"unknown run {run!r}")
            raise VigilInputError(f"run {run!r} has no scalar {tag!r}")
        steps, walls, values = segments[0]
        for next_steps, next_walls, next_values in segments[1:]:
            if len(next_steps) == 0:
                continue
            keep = steps < next_steps.min()
            steps = np.concatenate([steps[keep], next_steps])
            walls = np.concatenate([walls[keep], next_walls])
            values = np.concatenate([values[keep], next_values])
        order = np.argsort(steps, kind="stable")
        steps, walls, values = steps[order], walls[order], values[order]
        # Within one segment a step written twice keeps its last value, as TensorBoard shows it.
        last = np.ones(len(steps), dtype=bool)
        last[:-1] = steps[1:] != steps[:-1]
        return Series(run, tag, steps[last], walls[last], values[last])

    def compare_locked(
        self, runs: Sequence[str], tag: str, align: Literal["step", "time"], points: int
    ) -> list[tuple[Series, np.ndarray]]:
        with self.lock:
            return self.compare(runs, tag, align, points)

    def compare(
        self, runs: Sequence[str], tag: str, align: Literal["step", "time"] = "step", points: int = 1000
    ) -> list[tuple[Series, np.ndarray]]:
        """Each run's series (downsampled to ``points``) with its x values: step, or seconds since its start."""
        if align not in ("step", "time"):
            raise VigilInputError(f"align must be step or time, not {align!r}")
        out = []
        for run in runs:
            preview = self._preview(run, tag, points)
            if preview is None:
                full = self.series(run, tag)
                preview = full.downsampled(points), float(full.walls.min())
            shown, first_wall = preview
            x = shown.steps.astype(np.float64) if align == "step" else shown.walls - first_wall
            out.append((shown, x))
        return out
