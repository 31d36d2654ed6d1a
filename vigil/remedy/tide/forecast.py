"""Seasonal-naive forecast with a burst guard.

The next intervals repeat the same intervals one season (a day) earlier, scaled by how today's recent
level compares with that day's; the forecast never falls below the recent burst peak, since a burst
that just happened is the best sign that another may follow. Without a full season of history the
recent burst peak alone is the forecast. The envelope (``spread``) widens each season-old twin to its
neighbours, so a forecast that capacity is promised on does not move with every burst.
"""

from __future__ import annotations

import numpy as np


class SeasonalBurstForecaster:
    """``fit(history)`` on per-interval peak rates, then ``predict(horizon)``."""

    def __init__(self, season: int, burst_window: int = 6, level_window: int = 12) -> None:
        self.season = season
        self.burst_window = burst_window
        self.level_window = level_window

    def fit(self, history: np.ndarray) -> SeasonalBurstForecaster:
        if history.size == 0:
            raise ValueError("no history to forecast from")
        self.history_ = np.asarray(history, dtype=float)
        return self

    def predict(self, horizon: int, spread: int = 0) -> np.ndarray:
        """The next ``horizon`` intervals; with ``spread`` > 0 each takes the busiest of the intervals within
        ``spread`` of its season-old twin, an envelope to size what must not move at short notice."""
        history = self.history_
        burst = float(history[-self.burst_window :].max())
        if history.size < self.season + self.level_window:
            return np.full(horizon, burst)
        now = history[-self.level_window :].mean()
        then = history[-self.season - self.level_window : -self.season].mean()
        level = now / then if then > 0 else 1.0
        steps = np.arange(horizon)
        # the same interval a season ago; past the last season-old point, wrap onto older seasons
        index = history.size - self.season + steps
        index = np.where(
            index >= history.size, index - self.season * (1 + (index - history.size) // self.season), index
        )
        seasonal = level * np.array(
            [history[max(i - spread, 0) : min(i + spread + 1, history.size)].max() for i in index]
        )
        # a burst guard fading over one burst window, so far intervals follow the season
        fade = np.clip(1.0 - steps / max(self.burst_window, 1), 0.0, 1.0)
        return np.maximum(seasonal, burst * fade)
