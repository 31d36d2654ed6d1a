from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from vigil.model import VigilInputError
from vigil.store.metrics import CHUNK_FRAMES, MetricFrame, MetricStore

ENTITIES = ["gpu/n0/0", "gpu/n0/1"]
METRICS = ["A", "B"]


def frame(ts: float) -> MetricFrame:
    return MetricFrame(ts, "gpu", ENTITIES, METRICS, np.array([[ts, -ts], [2 * ts, np.nan]], dtype=np.float32))


def test_series_and_window_across_chunks(tmp_path: Path) -> None:
    store = MetricStore(tmp_path)
    n = CHUNK_FRAMES + 10
    for k in range(n):
        store.append(frame(float(k)))
    ts, values = store.series("gpu/n0/1", "A", start=5, end=7)
    np.testing.assert_array_equal(ts, [5, 6, 7])
    np.testing.assert_array_equal(values, [10, 12, 14])
    ts, cube = store.window("gpu", 20)
    assert cube.shape == (20, 2, 2) and ts[-1] == n - 1 and ts[0] == n - 20
    store.flush()
    reopened = MetricStore(tmp_path)
    assert reopened.frame_count("gpu") == n
    np.testing.assert_array_equal(reopened.series("gpu/n0/0", "B")[1], -np.arange(n, dtype=np.float32))


def test_bad_frames_are_rejected() -> None:
    store = MetricStore()
    with pytest.raises(VigilInputError, match="does not match"):
        MetricFrame(0, "gpu", ENTITIES, METRICS, np.zeros((3, 2)))
    store.append(frame(5))
    with pytest.raises(VigilInputError, match="older"):
        store.append(frame(4))
    with pytest.raises(VigilInputError, match="no metrics stored"):
        store.series("gpu/n9/0", "A")
    assert store.frame_count("gpu") == 1


@pytest.mark.parametrize(("damage", "message"), [
    (lambda p: (p / "gpu.000000.npz").write_bytes(b"\x00not a numpy archive" * 8), "gpu.000000.npz is corrupt"),
    (lambda p: (p / "gpu.open.npz").write_bytes(b"PK\x03\x04 truncated zip"), "gpu.open.npz is corrupt"),
    (lambda p: (p / "gpu.000000.npz").unlink(), "gpu.000000.npz is missing"),
    (lambda p: (p / "index.json").write_text('{"gpu": 3}'), "index.json is corrupt"),
])
def test_a_damaged_store_directory_is_one_clear_error_and_stays_as_it_was(
        tmp_path: Path, damage: Callable[[Path], object], message: str) -> None:
    store = MetricStore(tmp_path)
    for k in range(CHUNK_FRAMES + 3):
        store.append(frame(float(k)))
    store.flush()
    damage(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(VigilInputError, match=message):
        MetricStore(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
