"""Directory usage at any level of a tree, with a cache so a re-scan visits only changed directories.

The numbers are GNU ``du``'s: disk usage is ``st_blocks * 512`` of every inode under a directory (files,
directories, symlinks, not followed), apparent size is ``st_size``, and an inode with several hard links
is counted once, in the directory where du's walk meets it first. The cache keeps, per directory, its
identity (device, inode), its ``mtime`` and ``ctime`` and what it holds directly. A directory whose
identity and times are unchanged has the same entries, so it is not listed again: a re-scan stats each
directory once instead of every file.

What the cache cannot see: a file rewritten in place (same name, new size), or given a first extra name in
another directory, changes the file's inode, not its directory. Checkpoint writers create new files and
directories, which the cache sees; for volumes where files grow in place, run a full scan (``full=True``)
now and then.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import sqlite3
import stat
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import NamedTuple

from vigil.model import VigilInputError

BLOCK = 512
TABLE = "dir_records"  # the cache's table of directory records
# A directory changed within this long of the scan may change again in the same timestamp tick (ext4 stamps
# with a coarse clock), so its times are not trusted next time: it is listed again (as git does for racy files).
RACY_NS = 2_000_000_000


class DirRecord(NamedTuple):
    """What one directory holds directly (its files, symlinks and itself), and its child directories.

    A tuple, not a class with a ``__dict__``: records cross from the walking processes by pickle and are
    compared with the cached ones, both per directory.
    """

    path: str
    dev: int
    ino: int
    mtime_ns: int  # -1: not to be trusted next time (changed too recently, or unreadable)
    ctime_ns: int
    own_bytes: int
    own_apparent: int
    own_files: int
    subdirs: tuple[str, ...]
    # Inodes with more than one link (device, inode, bytes, apparent, place in the listing): counted once for the
    # whole tree, in the directory where du's walk meets them first.
    links: tuple[tuple[int, int, int, int, int], ...] = ()
    # Each subdirectory's place in this directory's listing (readdir order, which du's walk follows).
    subdir_positions: tuple[int, ...] = ()


class Usage(NamedTuple):
    """Totals of one directory's subtree (a tuple: one is made per directory on every scan)."""

    path: str
    bytes: int
    apparent: int
    files: int
    dirs: int


@dataclass
class ScanResult:
    root: str
    records: dict[str, DirRecord]
    totals: dict[str, Usage]
    listed: int  # directories whose entries were read (not taken from the cache)
    reused: int  # directories taken from the cache after one stat
    seconds: float

    def top(self, n: int, depth: int | None = None) -> list[Usage]:
        """The ``n`` largest directories by disk usage, at most ``depth`` levels below the root."""
        base = self.root.rstrip(os.sep).count(os.sep)
        rows = [
            u for p, u in self.totals.items() if p != self.root and (depth is None or p.count(os.sep) - base <= depth)
        ]
        return sorted(rows, key=lambda u: (-u.bytes, u.path))[:n]

    def at_depth(self, depth: int) -> list[Usage]:
        """Every directory exactly ``depth`` levels below the root, largest first (depth 0 is the root)."""
        base = self.root.rstrip(os.sep).count(os.sep)
        rows = [u for p, u in self.totals.items() if p.count(os.sep) - base == depth]
        return sorted(rows, key=lambda u: (-u.bytes, u.path))


# A directory to visit, with its lstat (taken from its parent's listing, or by path under a cached parent).
Pending = tuple[str, os.stat_result]

_blocks = attrgetter("st_blocks")
_size = attrgetter("st_size")
_mode = attrgetter("st_mode")
_nlink = attrgetter("st_nlink")


def _stat_names(names: list[str], fd: int) -> tuple[list[str], list[os.stat_result]]:
    """lstat of every name in the directory ``fd``, skipping names removed meanwhile (du skips them too)."""
    lstat = os.lstat
    try:
        return names, [lstat(name, dir_fd=fd) for name in names]
    except FileNotFoundError:
        kept, infos = [], []
        for name in names:
            try:
                infos.append(lstat(name, dir_fd=fd))
            except FileNotFoundError:
                continue
            kept.append(name)
        return kept, infos


def _list_directory(path: str, st: os.stat_result, mtime_ns: int) -> tuple[DirRecord, list[Pending]]:
    # Every entry is stat'ed relative to the directory's descriptor (an fstatat(), as du's fts does), directories
    # included: their stat is the one their own visit needs, so no directory is stat'ed twice. Names come from
    # listdir, not scandir: no DirEntry object per file. The per-file work is C-level maps and sums; only a
    # directory holding subdirectories or hard-linked files takes the loop below.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        names, infos = _stat_names(os.listdir(fd), fd)
    finally:
        os.close(fd)
    if not any(map(stat.S_ISDIR, map(_mode, infos))) and max(map(_nlink, infos), default=1) == 1:
        own_bytes = (st.st_blocks + sum(map(_blocks, infos))) * BLOCK
        own_apparent = st.st_size + sum(map(_size, infos))
        record = DirRecord(
            path, st.st_dev, st.st_ino, mtime_ns, st.st_ctime_ns, own_bytes, own_apparent, len(infos), ()
        )
        return record, []
    prefix = path if path.endswith(os.sep) else path + os.sep
    placed: list[tuple[str, os.stat_result, int]] = []
    files: list[os.stat_result] = []
    links: list[tuple[int, int, int, int, int]] = []
    for position, (name, info) in enumerate(zip(names, infos, strict=True)):
        if stat.S_ISDIR(info.st_mode):
            placed.append((prefix + name, info, position))
        elif info.st_nlink > 1:
            links.append((info.st_dev, info.st_ino, info.st_blocks * BLOCK, info.st_size, position))
        else:
            files.append(info)
    placed.sort(key=itemgetter(0))
    children: list[Pending] = [(child, info) for child, info, _ in placed]
    record = DirRecord(
        path,
        st.st_dev,
        st.st_ino,
        mtime_ns,
        st.st_ctime_ns,
        (st.st_blocks + sum(map(_blocks, files))) * BLOCK,
        st.st_size + sum(map(_size, files)),
        len(files) + len(links),
        tuple(child[len(prefix) :] for child, _ in children),
        tuple(links),
        tuple(position for _, _, position in placed),
    )
    return record, children


class ScanCache:
    """Per-root directory records in one SQLite file, replaced whole after each scan (never half-written)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self, root: str) -> dict[str, DirRecord]:
        if not self.path.is_file():
            return {}
        try:
            with sqlite3.connect(self.path) as db:
                # A cache written before the records kept listing places (table "dirs") is not read: one full scan.
                if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone():
                    return {}
                rows = db.execute(
                    "SELECT path, dev, ino, mtime_ns, ctime_ns, own_bytes, own_apparent, own_files, subdirs, links,"
                    f" subdir_positions FROM {TABLE} WHERE root = ?",
                    (root,),
                ).fetchall()
        except sqlite3.DatabaseError as err:
            raise VigilInputError(f"usage cache {self.path} is not a readable cache: {err}") from None
        records = {}
        for path, dev, ino, mtime_ns, ctime_ns, own_bytes, own_apparent, own_files, subdirs, links, places in rows:
            if not subdirs and not links:  # most directories: files only
                records[path] = DirRecord(path, dev, ino, mtime_ns, ctime_ns, own_bytes, own_apparent, own_files, ())
                continue
            records[path] = DirRecord(
                path,
                dev,
                ino,
                mtime_ns,
                ctime_ns,
                own_bytes,
                own_apparent,
                own_files,
                tuple(subdirs.split("\0")) if subdirs else (),
                tuple((int(a), int(b), int(c), int(d), int(e)) for a, b, c, d, e in json.loads(links)) if links else (),
                tuple(int(p) for p in places.split(",")) if places else (),
            )
        return records

    def save(self, result: ScanResult, cached: dict[str, DirRecord], history_depth: int) -> None:
        """Write the directories that changed since ``cached`` and the totals down to ``history_depth``.

        One SQLite transaction: a crash mid-save leaves the previous cache, never half of this one.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A directory taken from the cache is the cached record itself; only the ones listed again are written.
        changed = [r for path, r in result.records.items() if cached.get(path) is not r]
        removed = [(result.root, path) for path in cached.keys() - result.records.keys()]
        try:
            db = sqlite3.connect(self.path)
        except sqlite3.DatabaseError as err:
            raise VigilInputError(f"usage cache {self.path} cannot be written: {err}") from None
        try:
            # Write-ahead log, no fsync per commit: a crash still leaves the previous cache or this one, and the
            # cache is a shortcut, not a record (a lost one costs one full scan).
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            with db:
                db.execute("DROP TABLE IF EXISTS dirs")  # the records of an earlier version, without listing places
                db.execute(
                    f"CREATE TABLE IF NOT EXISTS {TABLE} (root TEXT, path TEXT, dev INTEGER, ino INTEGER,"
                    " mtime_ns INTEGER, ctime_ns INTEGER, own_bytes INTEGER, own_apparent INTEGER,"
                    " own_files INTEGER, subdirs TEXT, links TEXT, subdir_positions TEXT, PRIMARY KEY (root, path))"
                )
                db.execute(
                    "CREATE TABLE IF NOT EXISTS history (root TEXT, ts REAL, path TEXT, bytes INTEGER,"
                    " apparent INTEGER, files INTEGER)"
                )
                db.executemany(f"DELETE FROM {TABLE} WHERE root = ? AND path = ?", removed)
                db.executemany(
                    f"INSERT OR REPLACE INTO {TABLE} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        (
                            result.root,
                            r.path,
                            r.dev,
                            r.ino,
                            r.mtime_ns,
                            r.ctime_ns,
                            r.own_bytes,
                            r.own_apparent,
                            r.own_files,
                            "\0".join(r.subdirs),
                            json.dumps(r.links) if r.links else "",
                            ",".join(map(str, r.subdir_positions)),
                        )
                        for r in changed
                    ),
                )
                now = time.time()
                deeper = (u for d in range(1, history_depth + 1) for u in result.at_depth(d))
                rows = [result.totals[result.root], *deeper]
                db.executemany(
                    "INSERT INTO history VALUES (?, ?, ?, ?, ?, ?)",
                    ((result.root, now, u.path, u.bytes, u.apparent, u.files) for u in rows),
                )
        except sqlite3.DatabaseError as err:
            raise VigilInputError(f"usage cache {self.path} cannot be written: {err}") from None
        finally:
            db.close()

    def history(self, root: str, path: str | None = None) -> list[tuple[float, str, int]]:
        """(time, directory, bytes) of past scans of ``root``, oldest first; one directory if given."""
        if not self.path.is_file():
            return []
        query = "SELECT ts, path, bytes FROM history WHERE root = ?"
        args: tuple[str, ...] = (root,)
        if path is not None:
            query += " AND path = ?"
            args = (root, path)
        with sqlite3.connect(self.path) as db:
            return [(float(t), str(p), int(b)) for t, p, b in db.execute(query + " ORDER BY ts, path", args)]


@dataclass
class _Walk:
    """One traversal's inputs, shared by the walking processes (inherited by fork, never pickled)."""

    cached: dict[str, DirRecord]
    full: bool
    started_ns: int


_WALK: _Walk | None = None


def _children_by_path(record: DirRecord) -> list[Pending]:
    prefix = record.path if record.path.endswith(os.sep) else record.path + os.sep
    paths = [prefix + name for name in record.subdirs]
    lstat = os.lstat
    try:
        return [(path, lstat(path)) for path in paths]
    except FileNotFoundError:  # removed since the listing: skipped, as du skips it
        children = []
        for path in paths:
            try:
                children.append((path, lstat(path)))
            except FileNotFoundError:
                continue
        return children


def _list_again(path: str, st: os.stat_result) -> tuple[DirRecord, list[Pending]] | None:
    assert _WALK is not None
    racy = st.st_mtime_ns >= _WALK.started_ns - RACY_NS
    try:
        return _list_directory(path, st, -1 if racy else st.st_mtime_ns)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        # du reports an unreadable directory and counts the directory itself; so do we.
        return DirRecord(path, st.st_dev, st.st_ino, -1, -1, st.st_blocks * BLOCK, st.st_size, 0, ()), []


def _walk_from(
    frontier: list[Pending], records: dict[str, DirRecord], progress: Callable[[int], None] | None, stop_at: int = 0
) -> tuple[list[Pending], int, int]:
    """Breadth-first from ``frontier``; returns the unvisited frontier once it holds ``stop_at`` directories."""
    assert _WALK is not None
    cached = {} if _WALK.full else _WALK.cached
    listed = reused = 0
    while frontier and (not stop_at or len(frontier) < stop_at):
        next_frontier: list[Pending] = []
        for path, st in frontier:
            # Inline, not a method: on a re-scan this comparison is most of the work per directory.
            old = cached.get(path)
            if old is not None and (old.dev, old.ino, old.mtime_ns, old.ctime_ns) == (
                st.st_dev,
                st.st_ino,
                st.st_mtime_ns,
                st.st_ctime_ns,
            ):
                records[path] = old
                reused += 1
                if old.subdirs:
                    next_frontier += _children_by_path(old)
                continue
            found = _list_again(path, st)
            if found is not None:
                records[path] = found[0]
                listed += 1
                next_frontier += found[1]
        if progress:
            progress(len(records))
        frontier = next_frontier
    return frontier, listed, reused


def _walk_share(share: list[Pending]) -> tuple[list[DirRecord], int, int]:
    """A walking process's part: whole subtrees, returned as records in walk order (parents first)."""
    records: dict[str, DirRecord] = {}
    _, listed, reused = _walk_from(share, records, None)
    return list(records.values()), listed, reused


def default_workers() -> int:
    """Walking processes for this machine: one per CPU this process may run on, at most 8."""
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def _walk(
    root: str, cached: dict[str, DirRecord], full: bool, workers: int, progress: Callable[[int], None] | None
) -> tuple[dict[str, DirRecord], int, int]:
    global _WALK
    _WALK = _Walk(cached, full, time.time_ns())
    records: dict[str, DirRecord] = {}
    try:
        frontier: list[Pending] = [(root, os.lstat(root))]
        # A re-scan with a cache stays in this process: it stats one inode per unchanged directory, and forking
        # and sending every record back cost more than that (0.47 s against 0.22 s on the 1,000,000-file tree).
        if workers == 1 or (cached and not full) or "fork" not in multiprocessing.get_all_start_methods():
            _, listed, reused = _walk_from(frontier, records, progress)
            return records, listed, reused
        # A first scan sends whole subtrees to forked processes, each sending back one record per directory.
        # Threads do not help: the per-file Python work holds the GIL, and on 2 cores 4 threads were 2.6x slower
        # than one. A tree too small to give every process a few subtrees is walked here.
        frontier, listed, reused = _walk_from(frontier, records, progress, stop_at=4 * workers)
        if len(frontier) < 2 * workers:
            frontier, more_listed, more_reused = _walk_from(frontier, records, progress)
            return records, listed + more_listed, reused + more_reused
        frontier.sort(key=itemgetter(0))
        shares = [frontier[i :: 4 * workers] for i in range(4 * workers)]
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            for part, part_listed, part_reused in pool.map(_walk_share, [s for s in shares if s]):
                records.update((r.path, r) for r in part)
                listed += part_listed
                reused += part_reused
                if progress:
                    progress(len(records))
        return records, listed, reused
    finally:
        _WALK = None


def _charge_hard_links(records: dict[str, DirRecord]) -> dict[str, tuple[int, int]]:
    """Bytes and apparent size of hard-linked inodes charged to each directory, where du charges them.

    du's walk (fts) is depth-first and takes each directory's entries in listing (readdir) order; it counts an
    inode at the first name it meets. A name's place in that walk is the listing places on the way down to it,
    compared as tuples. ``records`` holds every parent before its children (the walk's order).
    """
    places: dict[str, tuple[int, ...]] = {}  # the root's place is ()
    met: list[tuple[tuple[int, ...], int, int, int, int, str]] = []
    for path, r in records.items():
        here = places.get(path, ())
        if r.subdirs:
            prefix = path if path.endswith(os.sep) else path + os.sep
            for name, position in zip(r.subdirs, r.subdir_positions, strict=True):
                places[prefix + name] = (*here, position)
        met.extend(
            ((*here, position), dev, ino, nbytes, apparent, path) for dev, ino, nbytes, apparent, position in r.links
        )
    met.sort(key=itemgetter(0))
    seen: set[tuple[int, int]] = set()
    own: dict[str, tuple[int, int]] = {}
    for _, dev, ino, nbytes, apparent, path in met:
        if (dev, ino) not in seen:
            seen.add((dev, ino))
            charged = own.get(path, (0, 0))
            own[path] = (charged[0] + nbytes, charged[1] + apparent)
    return own


def _totals(records: dict[str, DirRecord]) -> dict[str, Usage]:
    """Subtree totals; ``records`` holds every parent before its children (the walk's order)."""
    own: dict[str, tuple[int, int]] = {}
    if any(r.links for r in records.values()):
        own = _charge_hard_links(records)
    totals: dict[str, Usage] = {}
    sep = os.sep
    for r in reversed(list(records.values())):
        path = r.path
        if not r.subdirs and not r.links:  # most directories: files only
            totals[path] = Usage(path, r.own_bytes, r.own_apparent, r.own_files, 1)
            continue
        link_bytes, link_apparent = own.get(path, (0, 0))
        nbytes, apparent, files, dirs = r.own_bytes + link_bytes, r.own_apparent + link_apparent, r.own_files, 1
        prefix = path + sep if not path.endswith(sep) else path
        for name in r.subdirs:
            child = totals.get(prefix + name)
            if child is not None:
                nbytes += child.bytes
                apparent += child.apparent
                files += child.files
                dirs += child.dirs
        totals[path] = Usage(path, nbytes, apparent, files, dirs)
    return totals


def scan(
    root: Path,
    cache: ScanCache | None = None,
    *,
    full: bool = False,
    workers: int | None = 1,
    history_depth: int = 2,
    progress: Callable[[int], None] | None = None,
) -> ScanResult:
    """Usage of every directory under ``root``; with a cache, only changed directories are listed again.

    ``workers`` processes walk separate subtrees (``None``: ``default_workers()``); 1 walks in this process.
    """
    if not root.exists():
        raise VigilInputError(f"{root} does not exist")
    if not root.is_dir():
        raise VigilInputError(f"{root} is not a directory")
    if workers is None:
        workers = default_workers()
    if workers < 1:
        raise VigilInputError(f"workers must be at least 1, not {workers}")
    top = os.path.abspath(root)
    start = time.perf_counter()
    # The records, stat results and totals hold no reference cycles, yet every few hundred of them would start a
    # cyclic collection that walks all the records made so far: 10% of a re-scan's CPU. Off for the scan only.
    collecting = gc.isenabled()
    gc.disable()
    try:
        cached = cache.load(top) if cache is not None else {}
        records, listed, reused = _walk(top, cached, full, workers, progress)
        result = ScanResult(top, records, _totals(records), listed, reused, 0.0)
    finally:
        if collecting:
            gc.enable()
    result.seconds = time.perf_counter() - start
    if cache is not None:
        cache.save(result, cached, history_depth)
    return result
