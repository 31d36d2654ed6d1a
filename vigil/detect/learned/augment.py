"""Synthetic anomalies for training: copies of normal windows with a deviation injected into their newest rows.

A classifier trained on the labelled faults of a few machines learns those machines' faults. Windows whose
recent rows break from their own past in generic ways (a level shift, a spike, a ramp, a burst of variance on a
few metrics) teach it the shape of "unlike this window's own history" that any machine's fault shares, the
contextual outlier exposure of NCAD (Carmona et al., IJCAI'22). The injected size is in units of each metric's
spread over the window's own past (with a floor of a tenth of the metric's spread over the whole training set,
so a flat metric still moves), so it means the same on every machine and under every input scaling.
"""

from __future__ import annotations

import numpy as np

from vigil.detect.learned.windows import WindowSet
from vigil.model import VigilInputError

KINDS = ("shift", "spike", "ramp", "variance")
# Injected deviation, in units of the metric's spread over the window's past.
MAGNITUDE = (3.0, 8.0)


def inject(windows: np.ndarray, recent: int, rng: np.random.Generator, floor: np.ndarray | None = None) -> np.ndarray:
    """Copies of ``windows`` (n, rows, metrics) with one synthetic anomaly each in their newest ``recent``
    rows, on 1..max(1, metrics // 4) metrics chosen at random; ``floor`` the per-metric smallest spread."""
    if windows.ndim != 3 or windows.shape[1] <= recent:
        raise VigilInputError(f"augment: windows of shape {windows.shape} have no past before {recent} recent rows")
    out = np.array(windows, dtype=np.float32, copy=True)
    n, rows, metrics = out.shape
    past = out[:, : rows - recent, :]
    spread = past.std(axis=1)
    if floor is not None:
        spread = np.maximum(spread, floor[None, :])
    spread = np.maximum(spread, 1e-3)
    most = max(1, metrics // 4)
    for i in range(n):
        chosen = rng.choice(metrics, size=int(rng.integers(1, most + 1)), replace=False)
        span = int(rng.integers(1, recent + 1))
        kind = KINDS[int(rng.integers(len(KINDS)))]
        size = rng.uniform(*MAGNITUDE) * spread[i, chosen] * rng.choice((-1.0, 1.0), size=len(chosen))
        tail = out[i, rows - span:, :]
        if kind == "shift":
            tail[:, chosen] += size
        elif kind == "spike":
            tail[-1, chosen] += size
        elif kind == "ramp":
            tail[:, chosen] += np.linspace(1.0 / span, 1.0, span)[:, None] * size
        else:
            centre = past[i, :, chosen].mean(axis=1) if past.shape[1] else tail[:, chosen].mean(axis=0)
            noise = rng.normal(size=(span, len(chosen))) * np.abs(size)[None, :] / 2
            tail[:, chosen] = centre + (tail[:, chosen] - centre) * rng.uniform(2.0, 4.0) + noise
    return out


def augmented(data: WindowSet, share: float, recent: int, seed: int = 0, anomaly_class: int = 1) -> WindowSet:
    """``data`` plus ``share * len(data)`` synthetic anomalies (class ``anomaly_class``) injected into copies
    of its normal windows; each copy keeps its source's context row."""
    if share <= 0:
        return data
    labels = data.labels
    normal = np.flatnonzero(labels == 0)
    count = min(int(round(share * len(data))), len(normal))
    if count == 0:
        return data
    rng = np.random.default_rng(seed)
    source = np.sort(rng.choice(normal, count, replace=False))
    floor = 0.1 * data.last_rows(seed=seed).std(axis=0)
    windows = inject(data.take(source), recent, rng, floor=floor)
    context = data.context
    return data.extended(windows, np.full(count, anomaly_class, dtype=np.int64),
                         None if context is None else context[source])
