"""Directory usage at any level of a tree, with a cache so a re-scan visits only changed directories.

The numbers are GNU ``du``'s: disk usage is ``st_blocks * 512`` of every inode under a directory (files,
directories, symlinks, not followed), apparent size is ``st_size``, and an inode with several hard links
is counted once. The cache keeps, per directory, its identity (device, inode), its ``mtime`` and
``ctime`` and what it holds directly. A directory whose identity and times are unchanged has the same
entries, so it is not listed again: a re-scan stats each directory once instead of every file.

What the cache cannot see: a file rewritten in place (same name, new size) changes the file's times, not
its directory's. Checkpoint writers create new files and directories, which the cache sees; for volumes
where files grow in place, run a full scan (``full=True``) now and then.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from vigil.model import VigilInputError

BLOCK = 512
# A directory changed within this long of the scan may change again in the same timestamp tick (ext4 stamps
# with a coarse clock), so its times are not trusted next time: it is listed again (as git does for racy files).
RACY_NS = 2_000_000_000


@dataclass
class DirRecord:
    """What one directory holds directly (its files, symlinks and itself), and its child directories."""

    path: str
    dev: int
    ino: int
    mtime_ns: int
    ctime_ns: int
    own_bytes: int
    own_apparent: int
    own_files: int
    subdirs: list[str]
    # Inodes with more than one link: counted once for the whole tree, wherever they are first met.
    links: list[tuple[int, int, int, int]] = field(default_factory=list)

    def same_identity(self, st: os.stat_result) -> bool:
        return (self.dev, self.ino, self.mtime_ns, self.ctime_ns) == (
            st.st_dev,
            st.st_ino,
            st.st_mtime_ns,
            st.st_ctime_ns,
        )


@dataclass(frozen=True)
class Usage:
    """Totals of one directory's subtree."""

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
            u
            for p, u in self.totals.items()
            if p != self.root and (depth is None or p.count(os.sep) - base <= depth)
        ]
        return sorted(rows, key=lambda u: (-u.bytes, u.path))[:n]

    def at_depth(self, depth: int) -> list[Usage]:
        """Every directory exactly ``depth`` levels below the root, largest first (depth 0 is the root)."""
        base = self.root.rstrip(os.sep).count(os.sep)
        rows = [u for p, u in self.totals.items() if p.count(os.sep) - base == depth]
        return sorted(rows, key=lambda u: (-u.bytes, u.path))


def _stat_all(names: list[str], fd: int) -> list[os.stat_result]:
    """lstat of every name in the directory ``fd``, skipping names removed meanwhile (du skips them too)."""
    lstat = os.lstat
    try:
        return [lstat(name, dir_fd=fd) for name in names]
    except FileNotFoundError:
        found = []
        for name in names:
            try:
                found.append(lstat(name, dir_fd=fd))
            except FileNotFoundError:
                continue
        return found


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _list_directory(path: str, st: os.stat_result) -> DirRecord:
    # Listing through a directory descriptor makes each entry's stat an fstatat() relative to it, as du's fts
    # does, instead of resolving the whole path again for every file. The entry type from the listing (d_type)
    # tells directories apart without a stat; every other entry needs one, for its blocks. The per-file work
    # is comprehensions and sums, the cheapest Python has: the stat calls themselves release the GIL, so
    # threads walking other subtrees run meanwhile.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(fd) as listing:
            entries = list(listing)
        try:
            kinds = [e.is_dir(follow_symlinks=False) for e in entries]
        except OSError:  # no d_type on this file system and an entry went away before its stat
            kinds = [_is_dir(e) for e in entries]
        subdirs = sorted(e.name for e, is_dir in zip(entries, kinds, strict=True) if is_dir)
        others = [e.name for e, is_dir in zip(entries, kinds, strict=True) if not is_dir]
        infos = _stat_all(others, fd)
    finally:
        os.close(fd)
    links: list[tuple[int, int, int, int]] = []
    if any(info.st_nlink > 1 for info in infos):
        shared = [i for i in infos if i.st_nlink > 1 and not stat.S_ISDIR(i.st_mode)]
        links = [(i.st_dev, i.st_ino, i.st_blocks * BLOCK, i.st_size) for i in shared]
        infos = [i for i in infos if not (i.st_nlink > 1 and not stat.S_ISDIR(i.st_mode))]
    own_bytes = (st.st_blocks + sum(i.st_blocks for i in infos)) * BLOCK
    own_apparent = st.st_size + sum(i.st_size for i in infos)
    own_files = len(infos) + len(links)
    return DirRecord(
        path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, own_bytes, own_apparent, own_files, subdirs, links
    )


class ScanCache:
    """Per-root directory records in one SQLite file, replaced whole after each scan (never half-written)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self, root: str) -> dict[str, DirRecord]:
        if not self.path.is_file():
            return {}
        try:
            with sqlite3.connect(self.path) as db:
                rows = db.execute(
                    "SELECT path, dev, ino, mtime_ns, ctime_ns, own_bytes, own_apparent, own_files, subdirs, links "
                    "FROM dirs WHERE root = ?",
                    (root,),
                ).fetchall()
        except sqlite3.DatabaseError as err:
            raise VigilInputError(f"usage cache {self.path} is not a readable cache: {err}") from None
        records = {}
        for row in rows:
            path, dev, ino, mtime_ns, ctime_ns, own_bytes, own_apparent, own_files, subdirs, links = row
            records[path] = DirRecord(
                path,
                dev,
                ino,
                mtime_ns,
                ctime_ns,
                own_bytes,
                own_apparent,
                own_files,
                subdirs.split("\0") if subdirs else [],
                [(int(a), int(b), int(c), int(d)) for a, b, c, d in json.loads(links)] if links else [],
            )
        return records

    def save(self, result: ScanResult, cached: dict[str, DirRecord], history_depth: int) -> None:
        """Write the directories that changed since ``cached`` and the totals down to ``history_depth``.

        One SQLite transaction: a crash mid-save leaves the previous cache, never half of this one.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        changed = [r for path, r in result.records.items() if cached.get(path) != r]
        removed = [(result.root, path) for path in cached.keys() - result.records.keys()]
        try:
            db = sqlite3.connect(self.path)
        except sqlite3.DatabaseError as err:
            raise VigilInputError(f"usage cache {self.path} cannot be written: {err}") from None
        try:
            with db:
                db.execute(
                    "CREATE TABLE IF NOT EXISTS dirs (root TEXT, path TEXT, dev INTEGER, ino INTEGER,"
                    " mtime_ns INTEGER, ctime_ns INTEGER, own_bytes INTEGER, own_apparent INTEGER,"
                    " own_files INTEGER, subdirs TEXT, links TEXT, PRIMARY KEY (root, path))"
                )
                db.execute(
                    "CREATE TABLE IF NOT EXISTS history (root TEXT, ts REAL, path TEXT, bytes INTEGER,"
                    " apparent INTEGER, files INTEGER)"
                )
                db.executemany("DELETE FROM dirs WHERE root = ? AND path = ?", removed)
                db.executemany(
                    "INSERT OR REPLACE INTO dirs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
    """One traversal's inputs, shared by the walking threads."""

    cached: dict[str, DirRecord]
    full: bool
    started_ns: int


_WALK: _Walk | None = None


def _visit(path: str) -> tuple[DirRecord, bool] | None:
    assert _WALK is not None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    old = _WALK.cached.get(path)
    if not _WALK.full and old is not None and old.same_identity(st):
        return old, False
    try:
        record = _list_directory(path, st)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        # du reports an unreadable directory and counts the directory itself; so do we.
        return DirRecord(path, st.st_dev, st.st_ino, -1, -1, st.st_blocks * BLOCK, st.st_size, 0, []), True
    if st.st_mtime_ns >= _WALK.started_ns - RACY_NS:
        record.mtime_ns = -1
    return record, True


def _walk_from(
    frontier: list[str], records: dict[str, DirRecord], progress: Callable[[int], None] | None, stop_at: int = 0
) -> tuple[list[str], int, int]:
    """Breadth-first from ``frontier``; returns the unvisited frontier once it holds ``stop_at`` directories."""
    listed = reused = 0
    while frontier and (not stop_at or len(frontier) < stop_at):
        next_frontier: list[str] = []
        for found in map(_visit, frontier):
            if found is None:
                continue
            record, was_listed = found
            records[record.path] = record
            listed += was_listed
            reused += not was_listed
            if record.subdirs:
                prefix = record.path if record.path.endswith(os.sep) else record.path + os.sep
                next_frontier.extend([prefix + name for name in record.subdirs])
        if progress:
            progress(len(records))
        frontier = next_frontier
    return frontier, listed, reused


def _walk_subtrees(roots: list[str]) -> tuple[dict[str, DirRecord], int, int]:
    records: dict[str, DirRecord] = {}
    _, listed, reused = _walk_from(roots, records, None)
    return records, listed, reused


def _walk(
    root: str, cached: dict[str, DirRecord], full: bool, workers: int, progress: Callable[[int], None] | None
) -> tuple[dict[str, DirRecord], int, int]:
    global _WALK
    _WALK = _Walk(cached, full, time.time_ns())
    records: dict[str, DirRecord] = {}
    try:
        if workers == 1:
            _, listed, reused = _walk_from([root], records, progress)
            return records, listed, reused
        # Subtrees go to threads: each file's lstat releases the GIL, so one thread's system calls run while
        # another does its Python work (forked processes were slower: every record came back pickled).
        frontier, listed, reused = _walk_from([root], records, progress, stop_at=8 * workers)
        shares = [frontier[i :: 4 * workers] for i in range(4 * workers)]
        with ThreadPoolExecutor(workers, thread_name_prefix="vigil-du") as pool:
            for part, part_listed, part_reused in pool.map(_walk_subtrees, [s for s in shares if s]):
                records.update(part)
                listed += part_listed
                reused += part_reused
                if progress:
                    progress(len(records))
        return records, listed, reused
    finally:
        _WALK = None


def _totals(records: dict[str, DirRecord]) -> dict[str, Usage]:
    """Subtree totals; ``records`` holds every parent before its children (the walk's order)."""
    seen_links: set[tuple[int, int]] = set()
    own: dict[str, tuple[int, int]] = {}
    # Hard-linked inodes go to the first directory in path order that holds one, as the names sort.
    for path in sorted(p for p, r in records.items() if r.links):
        nbytes = apparent = 0
        for dev, ino, link_bytes, link_apparent in records[path].links:
            if (dev, ino) not in seen_links:
                seen_links.add((dev, ino))
                nbytes += link_bytes
                apparent += link_apparent
        own[path] = (nbytes, apparent)
    totals: dict[str, Usage] = {}
    sep = os.sep
    for path in reversed(list(records)):
        r = records[path]
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
    workers: int = 1,
    history_depth: int = 2,
    progress: Callable[[int], None] | None = None,
) -> ScanResult:
    """Usage of every directory under ``root``; with a cache, only changed directories are listed again."""
    if not root.exists():
        raise VigilInputError(f"{root} does not exist")
    if not root.is_dir():
        raise VigilInputError(f"{root} is not a directory")
    if workers < 1:
        raise VigilInputError(f"workers must be at least 1, not {workers}")
    top = os.path.abspath(root)
    start = time.perf_counter()
    cached = cache.load(top) if cache is not None else {}
    records, listed, reused = _walk(top, cached, full, workers, progress)
    result = ScanResult(top, records, _totals(records), listed, reused, 0.0)
    result.seconds = time.perf_counter() - start
    if cache is not None:
        cache.save(result, cached, history_depth)
    return result
