"""Window features: a fixed summary of one window that a tree or a linear model can read.

For every metric, from a window of ``H`` rows whose newest ``recent`` rows are the recent context and the rest
its past:

- ``last``: the newest value; ``recent_mean`` and ``recent_std`` of the recent rows;
- ``z_last`` and ``z_recent``: the newest value and the recent mean relative to this window's own past,
  ``(x - mean(past)) / (std(past) + 0.1)``, clipped to +-10: how far the entity moved from itself;
- ``spread_ratio``: ``log((recent_std + 0.01) / (std(past) + 0.01))``: a metric that starts to oscillate.

The gradient-boosting baseline reads exactly these; TCE reads them as its context token, so the supervised
baseline and TCE see the same information.
"""

from __future__ import annotations

import numpy as np

from vigil.model import VigilInputError

FEATURES_PER_METRIC = ("last", "recent_mean", "recent_std", "z_last", "z_recent", "spread_ratio")
DEVIATION_CLIP = 10.0


def window_features(windows: np.ndarray, recent: int) -> np.ndarray:
    """(n, H, D) windows -> (n, D * 6) features, metric-major (all features of metric 0 first)."""
    arr = np.asarray(windows, dtype=np.float32)
    if arr.ndim != 3:
        raise VigilInputError(f"window features: expected (n, window, metrics), got shape {arr.shape}")
    if not 1 <= recent < arr.shape[1]:
        raise VigilInputError(f"window features: recent context of {recent} rows needs windows longer than it, "
                              f"got {arr.shape[1]} rows")
    past, rec = arr[:, :-recent, :], arr[:, -recent:, :]
    past_mean, past_std = past.mean(axis=1), past.std(axis=1)
    last, recent_mean, recent_std = rec[:, -1, :], rec.mean(axis=1), rec.std(axis=1)
    scale = past_std + 0.1
    columns = (
        last,
        recent_mean,
        recent_std,
        np.clip((last - past_mean) / scale, -DEVIATION_CLIP, DEVIATION_CLIP),
        np.clip((recent_mean - past_mean) / scale, -DEVIATION_CLIP, DEVIATION_CLIP),
        np.log((recent_std + 0.01) / (past_std + 0.01)),
    )
    return np.stack(columns, axis=2).reshape(len(arr), -1).astype(np.float32)


def feature_names(metrics: list[str]) -> list[str]:
    return [f"{m}:{f}" for m in metrics for f in FEATURES_PER_METRIC]
