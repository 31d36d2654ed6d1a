"""Directory usage: GNU du's numbers, first scan and incremental re-scans."""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require_binary
from vigil.model import VigilInputError
from vigil.sources.fscount import ScanCache, scan


def gnu_du(root: Path, apparent: bool = False) -> dict[str, int]:
    """Every directory's total as GNU du prints it (bytes)."""
    du = require_binary("du")
    flags = ["-b"] if apparent else ["-B1"]
    out = subprocess.run([du, *flags, str(root)], capture_output=True, text=True, check=True).stdout
    totals = {}
    for line in out.splitlines():
        size, path = line.split("\t", 1)
        totals[path] = int(size)
    return totals


def make_tree(root: Path, seed: int, dirs: int = 30) -> None:
    rng = random.Random(seed)
    paths = [root]
    for i in range(dirs):
        parent = rng.choice(paths)
        child = parent / f"d{i}"
        child.mkdir()
        paths.append(child)
    for i in range(dirs * 3):
        (rng.choice(paths) / f"f{i}").write_bytes(os.urandom(rng.choice([0, 1, 100, 4096, 5000, 70_000])))
    os.symlink("f0", rng.choice(paths) / "link")


def age(root: Path, seconds: float = 3600) -> None:
    """Make every directory look old, so the cache may trust its times."""
    past = time.time() - seconds
    for path in [root, *(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())]:
        os.utime(path, (past, past))


def by_path(result_totals: dict[str, object], attr: str) -> dict[str, int]:
    return {path: int(getattr(usage, attr)) for path, usage in result_totals.items()}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_directory_matches_gnu_du(tmp_path: Path, seed: int) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    make_tree(root, seed)
    result = scan(root)
    assert by_path(result.totals, "bytes") == gnu_du(root)
    assert by_path(result.totals, "apparent") == gnu_du(root, apparent=True)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_hard_links_count_once_where_du_counts_them(tmp_path: Path, seed: int) -> None:
    # Inodes with names in several directories at different depths: every directory's total must be du's,
    # which depends on which name du's walk meets first (its listing order, not the names' sort order).
    root = tmp_path / "tree"
    root.mkdir()
    make_tree(root, seed=seed, dirs=12)
    rng = random.Random(seed)
    dirs = [root, *sorted(p for p in root.rglob("d*") if p.is_dir())]
    sources = [p for p in sorted(root.rglob("f*")) if p.is_file() and p.stat().st_size > 0]
    linked = rng.sample(sources, 4)
    for i, source in enumerate(linked):
        for j in range(3):
            os.link(source, rng.choice(dirs) / f"link{i}-{j}")
    result = scan(root)
    assert by_path(result.totals, "bytes") == gnu_du(root)
    assert by_path(result.totals, "apparent") == gnu_du(root, apparent=True)
    # The same from the cache after one directory changed (the others' listing places come from the cache). The
    # new name is of an inode already linked: a first extra name of a plain file is a change of the file's
    # inode, not of its directory, which the cache cannot see (docs/productivity.md).
    age(root)
    cache = ScanCache(tmp_path / "cache.sqlite")
    scan(root, cache)
    os.link(linked[0], dirs[-1] / "one-more")
    again = scan(root, cache)
    assert 0 < again.listed < len(dirs)
    assert by_path(again.totals, "bytes") == gnu_du(root)
    assert by_path(again.totals, "apparent") == gnu_du(root, apparent=True)


def test_rescan_lists_only_changed_directories_and_stays_exact(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    make_tree(root, seed=7, dirs=40)
    age(root)
    cache = ScanCache(tmp_path / "cache.sqlite")
    first = scan(root, cache)
    assert first.listed == first.totals[str(root)].dirs and first.reused == 0

    second = scan(root, cache)
    assert second.listed == 0 and second.reused == first.listed
    assert by_path(second.totals, "bytes") == by_path(first.totals, "bytes")

    # A new file in one directory, a removed subtree, and a new directory with a file.
    dirs = sorted(p for p in root.rglob("d*") if p.is_dir())
    (dirs[0] / "new-checkpoint").write_bytes(os.urandom(123_456))
    victim = next(d for d in dirs[1:] if d.parent == root)
    shutil.rmtree(victim)
    (root / "fresh").mkdir()
    (root / "fresh" / "x").write_bytes(os.urandom(9000))
    third = scan(root, cache)
    assert by_path(third.totals, "bytes") == gnu_du(root)
    assert by_path(third.totals, "apparent") == gnu_du(root, apparent=True)
    assert 0 < third.listed <= 4


def test_recently_changed_directories_are_listed_again(tmp_path: Path) -> None:
    # A directory changed just before a scan may change again within the same clock tick: never trusted.
    root = tmp_path / "tree"
    root.mkdir()
    (root / "f").write_bytes(b"x" * 10)
    cache = ScanCache(tmp_path / "cache.sqlite")
    scan(root, cache)
    (root / "g").write_bytes(b"y" * 5000)
    again = scan(root, cache)
    assert again.listed == 1
    assert again.totals[str(root)].bytes == gnu_du(root)[str(root)]


def test_worker_processes_match_gnu_du_in_every_directory(tmp_path: Path) -> None:
    # 24 top-level subtrees: wide enough that 4 workers hand them to forked processes (at least 16 pending
    # directories after the root), with hard-linked inodes named in subtrees walked by different processes.
    root = tmp_path / "tree"
    root.mkdir()
    rng = random.Random(13)
    for i in range(24):
        top = root / f"t{i:02d}"
        top.mkdir()
        make_tree(top, seed=100 + i, dirs=4)
    for source, target in (("t00", "t23"), ("t05", "t17")):
        shared = next(p for p in sorted((root / source).rglob("f*")) if p.stat().st_size > 0)
        os.link(shared, root / target / "same")
    (root / "t09" / "empty-dir").mkdir()
    for i in range(20):
        (root / f"file-{i}").write_bytes(os.urandom(rng.choice([0, 10, 5000])))
    parallel = scan(root, workers=4)
    # A hard-linked inode is charged where du's depth-first walk in listing order meets it first, in every case.
    assert by_path(parallel.totals, "bytes") == gnu_du(root)
    assert by_path(parallel.totals, "apparent") == gnu_du(root, apparent=True)
    assert parallel.listed == len(gnu_du(root))
    one = scan(root, workers=1)
    assert parallel.records == one.records


def test_history_gives_growth(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "ckpt").mkdir(parents=True)
    cache = ScanCache(tmp_path / "cache.sqlite")
    scan(root, cache)
    (root / "ckpt" / "step-1").write_bytes(os.urandom(50_000))
    scan(root, cache)
    history = cache.history(str(root), str(root / "ckpt"))
    assert len(history) == 2
    assert history[1][2] - history[0][2] == gnu_du(root)[str(root / "ckpt")] - 4096


def test_bad_input_is_refused(tmp_path: Path) -> None:
    with pytest.raises(VigilInputError, match="does not exist"):
        scan(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(VigilInputError, match="not a directory"):
        scan(tmp_path / "file")
    bad = tmp_path / "cache.sqlite"
    bad.write_bytes(b"not a database at all" * 100)
    (tmp_path / "d").mkdir()
    with pytest.raises(VigilInputError, match="not a readable cache"):
        scan(tmp_path / "d", ScanCache(bad))
    assert bad.read_bytes() == b"not a database at all" * 100


def test_cli_json_and_errors(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    make_tree(root, seed=5)
    env = {**os.environ, "VIGIL_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-m", "vigil", "du", str(root), "--json", "--top", "3"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["bytes"] == gnu_du(root)[str(root)]
    assert len(report["top"]) == 3
    assert report["top"][0]["bytes"] >= report["top"][1]["bytes"] >= report["top"][2]["bytes"]
    missing = subprocess.run(
        [sys.executable, "-m", "vigil", "du", str(tmp_path / "nope")], capture_output=True, text=True, env=env
    )
    assert missing.returncode == 2
    assert len(missing.stderr.strip().splitlines()) == 1 and "does not exist" in missing.stderr


def test_a_cache_of_the_earlier_format_costs_one_full_scan(tmp_path: Path) -> None:
    # Records written before they kept listing places (table "dirs") are not trusted: listed again, then replaced.
    root = tmp_path / "tree"
    root.mkdir()
    make_tree(root, seed=9)
    age(root)
    path = tmp_path / "cache.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE dirs (root TEXT, path TEXT, dev INTEGER, ino INTEGER, mtime_ns INTEGER, ctime_ns INTEGER,"
            " own_bytes INTEGER, own_apparent INTEGER, own_files INTEGER, subdirs TEXT, links TEXT,"
            " PRIMARY KEY (root, path))"
        )
        st = root.stat()
        db.execute(
            "INSERT INTO dirs VALUES (?, ?, ?, ?, ?, ?, 1, 1, 1, '', '')",
            (str(root), str(root), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns),
        )
    db.close()
    first = scan(root, ScanCache(path))
    assert first.reused == 0 and by_path(first.totals, "bytes") == gnu_du(root)
    with sqlite3.connect(path) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    db.close()
    assert "dirs" not in tables
    second = scan(root, ScanCache(path))
    assert second.listed == 0 and by_path(second.totals, "bytes") == gnu_du(root)
