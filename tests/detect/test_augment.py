"""Synthetic anomalies injected into normal windows for training (vigil.detect.learned.augment)."""

from __future__ import annotations

import numpy as np
import pytest

from vigil.detect.learned.augment import augmented, inject
from vigil.detect.learned.tce import TCEDetector
from vigil.detect.learned.windows import WindowSet
from vigil.model import VigilInputError


def test_injection_moves_only_the_newest_rows_and_by_the_windows_own_spread() -> None:
    rng = np.random.default_rng(0)
    windows = rng.normal(size=(300, 40, 8)).astype(np.float32)
    out = inject(windows, recent=10, rng=np.random.default_rng(1))
    assert out.shape == windows.shape and not np.shares_memory(out, windows)
    # The past is untouched; every window changed in its recent rows.
    assert np.array_equal(out[:, :30], windows[:, :30])
    changed = np.abs(out - windows).max(axis=1)
    assert (changed.max(axis=1) > 0).all()
    # At most a quarter of the metrics move, and the largest move is at least 3 spreads of the past
    # (a spike or shift of 3..8 spreads; a ramp ends at its full size; a variance burst scales by 2..4).
    assert ((changed > 0).sum(axis=1) <= 2).all()
    spread = windows[:, :30].std(axis=1)
    assert np.median(changed.max(axis=1) / spread.max(axis=1)) > 2.0
    with pytest.raises(VigilInputError, match="no past"):
        inject(windows[:, :10], recent=10, rng=rng)


def test_augmented_set_adds_anomalies_from_normal_windows_and_keeps_the_rest() -> None:
    rng = np.random.default_rng(0)
    series = rng.normal(size=(500, 3)).astype(np.float32)
    labels = np.zeros(500, dtype=np.int64)
    labels[400:420] = 1
    data = WindowSet(24).add(series, labels, context=rng.normal(size=(500, 2)))
    more = augmented(data, 0.1, recent=6, seed=3)
    assert len(more) == len(data) + 50 and (more.labels[len(data):] == 1).all()
    assert np.array_equal(more.take(np.arange(len(data))), data.take(np.arange(len(data))))
    assert more.context is not None and more.context.shape == (550, 2)
    assert augmented(data, 0.0, recent=6) is data


def test_tce_trains_on_augmented_anomalies_and_refuses_them_for_several_classes() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 32, 4)).astype(np.float32)
    y = np.zeros(300, dtype=np.int64)
    X[:30, -3:, 1] += 5.0
    y[:30] = 1
    det = TCEDetector(history=32, recent=8, scales=(8,), hidden=8, epochs=1, steps_per_epoch=3, batch_size=32,
                      augment=0.2).fit(X, y)
    assert det.decision_function(X).shape == (300,)
    three = y.copy()
    three[:10] = 2
    with pytest.raises(VigilInputError, match="several"):
        TCEDetector(history=32, recent=8, scales=(8,), hidden=8, epochs=1, augment=0.2).fit(X, three)
