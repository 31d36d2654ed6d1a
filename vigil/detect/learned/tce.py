"""Temporal Context Encoding (TCE): a fault's long-term trend plus its critical recent context.

One input is a window of ``history`` rows ending now; its last ``recent`` rows are the full-resolution recent
context. Three branches encode it, and attention fuses them (maths in docs/detection.md):

- recent branch: the recent rows, each standardised by the fleet scaler and, beside it, by the entity's own
  long history (deviation ``(x - mean_hist) / (std_hist + eps)``), through two dilated 1-D convolutions;
  one token per recent step.
- long-history branch: the history averaged over several scales (e.g. 12 and 48 steps: the last hours at
  coarse resolution) as tokens with a scale embedding, plus a trend token (per-metric slope and spread).
- context branch: per-window context features (time since job start / restart / checkpoint, counts of recent
  events) as one token; with ``window_context=True`` also the window features of ``features.py`` (each metric's
  newest value, recent mean and spread, and their deviation from the window's own past), the same features
  the gradient-boosting baseline reads.
- normal-context memory: ``prototypes`` centroids of the fleet's normal recent contexts (k-means at fit time,
  fixed buffers); the sorted distances of the current context to them form one more token, and the smallest
  distance goes straight to the classifier: how unlike anything normal the fleet has shown is this context.

A query built from the recent branch attends over all tokens; query and attended summary feed a classifier
over ``normal + fault classes``. The anomaly score is ``1 - p(normal)``.

On a machine the model never trained on, the classifier knows only the faults of other machines. Two
label-free parts stand beside it: the novelty of the recent context against the fleet's normal prototypes,
and (``memory > 0``) a normal-window memory: k-means centroids of the newest ``memory_rows`` rows of normal
training windows as fed (not rescaled), the distance to the nearest one (TSB-AD's KMeansAD reading); and
(``embedding > 0``) a memory in the model's own learned space: k-means centroids of the classifier's hidden
layer over normal training windows, the distance to the nearest one. The classifier learnt that space to
tell faults from normal windows, so a distance there weighs what told faults apart on other machines while
asking for no label of the new one. ``relative_score`` reads each part against the machine's own unlabelled
history and combines them by the rule ``combine``: ``rank``, each part through ``history_rank`` and their
mean weighted by ``mix`` (supervised, novelty, memory, embedding); ``max``, the largest of the parts weighed by
``mix`` in units of the upper tail of their own history (``tail_standardise``), an OR of detectors that a part
which is only noise on this machine cannot drown; ``agree``, the rank mean with each part's weight scaled by
how well it agrees with the other parts on the machine's history (``agreement_weights``). Then the trailing
mean over the last ``smooth`` windows (so it stays causal). Every rule reads the machine's history only,
never a label or a later window of it; the rule, the weights and the smoothing are chosen on development
machines (vigil_eval.detection, inner folds of leave-machines-out; ``vigil detect train`` makes the same
choice).

``use_history=False`` / ``use_context=False`` / ``prototypes=0`` remove a part (ablation); the rest is
unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
import torch
from torch import nn

from vigil.detect.base import BaseDetector
from vigil.detect.learned.augment import augmented
from vigil.detect.learned.features import window_features
from vigil.detect.learned.loss import DynamicClassWeightedLoss, WeightMode
from vigil.detect.learned.train import (
    FORMAT_VERSION,
    Progress,
    Scaler,
    TrainReport,
    ensemble_report,
    fit_classifier,
    predict_proba,
)
from vigil.detect.learned.windows import WindowSet
from vigil.model import VigilInputError

DEVIATION_CLIP = 10.0
COMPONENTS = ("supervised", "novelty", "memory", "embedding", "own")
MEMORY_FIT_WINDOWS = 20000
# The own-history memory (``own_memory_distance``) is fitted on this older share of a machine's history windows;
# the newer rest is the reference its part is read against, so that reference is scored out of sample.
OWN_FIT_SHARE = 0.5
# Normal training windows embedded to fit the learned-space memory (a forward pass each).
EMBEDDING_FIT_WINDOWS = 5000
# How the parts of the score are combined (``combine_parts``).
COMBINE_RULES = ("rank", "max", "agree")
# The history quantile whose distance from the median is one unit of ``tail_standardise``.
TAIL_QUANTILE = 0.99


def full_mix(mix: Sequence[float]) -> tuple[float, ...]:
    """A mix of the first parts of ``COMPONENTS`` (models saved before the embedding part weigh three, before
    the own-history part four) padded with zero weights to all of them."""
    weights = tuple(float(w) for w in mix)
    if not 1 <= len(weights) <= len(COMPONENTS):
        raise VigilInputError(f"tce: mix {weights} weighs {len(weights)} parts, the model has {len(COMPONENTS)}")
    return weights + (0.0,) * (len(COMPONENTS) - len(weights))


def trailing_mean(scores: np.ndarray, width: int) -> np.ndarray:
    """Each score averaged with the ``width - 1`` before it (fewer at the start): a causal smoothing, so a
    live detector can apply it as each window arrives."""
    sc = np.asarray(scores, dtype=np.float64)
    if width <= 1 or not len(sc):
        return sc
    sums = np.cumsum(np.r_[0.0, sc])
    ends = np.arange(1, len(sc) + 1)
    starts = np.maximum(ends - width, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


def history_rank(scores: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Scores read against a machine's own history scores ``reference``: the share of the history at or below
    each score (0..1), plus, above the largest history score, the excess in units of the history's
    interquartile range, so scores beyond anything the machine has shown still rank. Label-free and
    increasing, so parts on different scales (a probability, a distance) can be averaged."""
    ref = np.sort(np.asarray(reference, dtype=np.float64))
    if not len(ref):
        raise VigilInputError("history_rank: no history scores to read against")
    sc = np.asarray(scores, dtype=np.float64)
    share = np.searchsorted(ref, sc, side="right") / len(ref)
    q25, q75 = np.percentile(ref, [25, 75])
    spread = max(float(q75 - q25), 1e-9)
    return share + np.maximum(sc - ref[-1], 0.0) / spread


def tail_standardise(scores: np.ndarray, reference: np.ndarray, quantile: float = TAIL_QUANTILE) -> np.ndarray:
    """Scores in units of the upper tail of a machine's own history scores ``reference``:
    ``(s - median) / (q - median)`` with ``q`` the history's ``quantile``, so 1 is as high as the history goes
    but for its top 1 %, whatever the part's scale (a probability, a distance)."""
    ref = np.asarray(reference, dtype=np.float64)
    if not len(ref):
        raise VigilInputError("tail_standardise: no history scores to read against")
    median, upper = np.percentile(ref, [50, 100 * quantile])
    return (np.asarray(scores, dtype=np.float64) - median) / max(float(upper - median), 1e-9)


def agreement_weights(reference_ranks: dict[str, np.ndarray], weights: dict[str, float]) -> dict[str, float]:
    """Each part's weight scaled by its agreement with the others on the machine's own history: the
    correlation of its history ranks with the weighted mean of the other parts' ranks, negative read as 0
    (a pseudo ground truth, as unsupervised outlier ensembles weigh their members). A part that does not
    carry over to this machine ranks its history unlike the rest and loses its weight. All correlations at
    0 (or one part) leave the weights as given."""
    if len(weights) < 2:
        return dict(weights)
    scaled = {}
    for name, w in weights.items():
        others = sum(v * reference_ranks[o] for o, v in weights.items() if o != name)
        own = reference_ranks[name]
        if np.std(own) < 1e-12 or np.std(others) < 1e-12:
            scaled[name] = 0.0
        else:
            scaled[name] = w * max(float(np.corrcoef(own, others)[0, 1]), 0.0)
    return scaled if sum(scaled.values()) > 0 else dict(weights)


@dataclass
class PartReadings:
    """The parts of one machine's score read against its own history, ready for every rule of
    ``COMBINE_RULES``: ranks (``history_rank``), tail units (``tail_standardise``) and the history's own
    ranks (for ``agreement_weights``)."""

    ranks: dict[str, np.ndarray]
    tails: dict[str, np.ndarray]
    reference_ranks: dict[str, np.ndarray]

    @classmethod
    def read(cls, parts: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> PartReadings:
        return cls(ranks={name: history_rank(parts[name], reference[name]) for name in parts},
                   tails={name: tail_standardise(parts[name], reference[name]) for name in parts},
                   reference_ranks={name: history_rank(reference[name], reference[name]) for name in parts})


def combine_parts(readings: PartReadings, mix: Sequence[float], rule: str = "rank") -> np.ndarray:
    """The parts weighed by ``mix`` (weights of ``COMPONENTS``) combined by ``rule``: ``rank``, the weighted
    mean of their ranks; ``max``, the largest of their tail units (``mix`` names the parts, an OR of
    detectors); ``agree``, the rank mean weighted by ``mix`` times each part's agreement with the others on
    the history."""
    used = {name: w for name, w in zip(COMPONENTS, full_mix(mix), strict=True) if w}
    missing = [name for name in used if name not in readings.ranks]
    if missing or not used:
        raise VigilInputError(f"tce: mix {tuple(mix)} weighs parts this model lacks: "
                              f"{', '.join(missing) or 'none weighed'}")
    if rule == "max":
        return np.max([readings.tails[name] for name in used], axis=0)
    if rule == "agree":
        if "own" in used:
            raise VigilInputError("tce: the own-history part is read against the newer half of the history only, "
                                  "so it has no agreement with the other parts; combine it by rank or max")
        used = agreement_weights(readings.reference_ranks, used)
    elif rule != "rank":
        raise VigilInputError(f"tce: unknown combination rule {rule!r}: expected one of {', '.join(COMBINE_RULES)}")
    total = sum(used.values())
    return np.sum([w / total * readings.ranks[name] for name, w in used.items() if w], axis=0)


class TemporalContextEncoder(nn.Module):
    prototypes: torch.Tensor
    prototype_scale: torch.Tensor

    def __init__(self, n_features: int, n_classes: int, *, recent: int = 30, history: int = 288,
                 scales: Sequence[int] = (12, 48), hidden: int = 32, heads: int = 4, n_context: int = 0,
                 use_history: bool = True, use_context: bool = True, prototypes: int = 0,
                 prototype_rows: int = 10, dropout: float = 0.1) -> None:
        super().__init__()
        if recent > history:
            raise ValueError(f"recent window ({recent}) longer than the history ({history})")
        self.n_features = n_features
        self.recent = recent
        self.history = history
        self.scales = tuple(s for s in scales if s <= history - recent) if use_history else ()
        self.use_history = use_history and history > recent
        self.use_context = use_context and n_context > 0
        self.n_context = n_context
        self._operators: dict[tuple[int, str], torch.Tensor] = {}
        in_channels = n_features * (2 if self.use_history else 1)
        self.recent_conv = nn.Sequential(
            nn.Conv1d(in_channels, hidden, kernel_size=3, padding=1), nn.GELU(),
            nn.Conv1d(hidden, hidden, kernel_size=3, padding=2, dilation=2), nn.GELU(),
        )
        self.recent_pos = nn.Parameter(torch.zeros(recent, hidden))
        if self.use_history:
            self.scale_proj = nn.Linear(n_features, hidden)
            self.scale_embed = nn.Parameter(torch.zeros(len(self.scales), hidden))
            self.trend_proj = nn.Linear(2 * n_features, hidden)
        if self.use_context:
            self.context_proj = nn.Sequential(nn.Linear(n_context, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        self.prototype_rows = min(prototype_rows, recent)
        self.n_prototypes = prototypes
        if prototypes:
            self.register_buffer("prototypes", torch.zeros(prototypes, self.prototype_rows * n_features))
            self.register_buffer("prototype_scale", torch.ones(()))
            self.prototype_proj = nn.Linear(prototypes, hidden)
        self.query = nn.Linear(2 * hidden, hidden)
        self.attention = nn.MultiheadAttention(hidden, heads, dropout=dropout, batch_first=True)
        self.norm = nn.LayerNorm(hidden)
        head_in = 2 * hidden + (1 if prototypes else 0) + (hidden if self.use_context else 0)
        self.head = nn.Sequential(nn.Linear(head_in, hidden), nn.GELU(),
                                  nn.Dropout(dropout),
                                  nn.Linear(hidden, n_classes))

    def forward(self, window: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """``window``: (batch, history, features), already standardised; ``context``: (batch, n_context)."""
        return self.head(self.fuse(window, context))

    def embed(self, window: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """The classifier's hidden layer (``hidden`` values per window): the learned space the logits are
        read from."""
        return self.head[1](self.head[0](self.fuse(window, context)))

    def fuse(self, window: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """Every branch fused into the classifier's input."""
        recent = window[:, -self.recent:, :]
        tokens = []
        if self.use_history:
            past = window[:, : -self.recent, :]
            # One matrix product gives every linear statistic of the past (mean, block means, slope), and
            # one pass the mean square: far cheaper on CPU than reductions along the middle axis.
            stats = torch.matmul(past.transpose(1, 2), self._past_operator(past.shape[1], window.device))
            mean = stats[:, :, :1].transpose(1, 2)
            n = past.shape[1]
            var = ((past.square().mean(dim=1, keepdim=True) - mean.square()) * (n / max(n - 1, 1))).clamp(min=0.0)
            std = var.sqrt()
            deviation = ((recent - mean) / (std + 0.1)).clamp(-DEVIATION_CLIP, DEVIATION_CLIP)
            recent_in = torch.cat([recent, deviation], dim=2)
        else:
            recent_in = recent
        recent_tokens = self.recent_conv(recent_in.transpose(1, 2)).transpose(1, 2) + self.recent_pos
        tokens.append(recent_tokens)
        if self.use_history:
            column = 1
            for k, scale in enumerate(self.scales):
                blocks = past.shape[1] // scale
                pooled = stats[:, :, column:column + blocks].transpose(1, 2)
                column += blocks
                tokens.append(self.scale_proj(pooled) + self.scale_embed[k])
            slope = stats[:, :, column]
            tokens.append(self.trend_proj(torch.cat([slope, std.squeeze(1)], dim=1)).unsqueeze(1))
        context_token = None
        if self.use_context:
            if context is None:
                raise ValueError("this model was built with context features; pass them")
            context_token = self.context_proj(context)
            tokens.append(context_token.unsqueeze(1))
        novelty = None
        if self.n_prototypes:
            distances = self.prototype_distances(window)
            tokens.append(self.prototype_proj(torch.log1p(distances)).unsqueeze(1))
            novelty = torch.log1p(distances[:, :1])
        keys = self.norm(torch.cat(tokens, dim=1))
        summary = torch.cat([recent_tokens.mean(dim=1), recent_tokens[:, -1, :]], dim=1)
        query = self.query(summary).unsqueeze(1)
        attended, _ = self.attention(query, keys, keys, need_weights=False)
        # Context and novelty also reach the classifier directly: a single decisive event (the Xid that
        # opened a fault) must not depend on the attention finding its token.
        fused = [query.squeeze(1), attended.squeeze(1)] + [t for t in (novelty, context_token) if t is not None]
        return torch.cat(fused, dim=1)

    def _past_operator(self, length: int, device: torch.device) -> torch.Tensor:
        """(length, 1 + blocks + 1) columns: the mean; the block means of each scale (blocks counted back from
        the newest row, oldest first); the least-squares slope against time on [-1, 1]."""
        key = (length, str(device))
        cached = self._operators.get(key)
        if cached is not None:
            return cached
        columns = [torch.full((length,), 1.0 / length)]
        for scale in self.scales:
            blocks = length // scale
            for b in range(blocks):
                col = torch.zeros(length)
                start = length - (blocks - b) * scale
                col[start:start + scale] = 1.0 / scale
                columns.append(col)
        # Centred steps sum to zero, so the slope needs no mean subtracted.
        steps = torch.linspace(-1.0, 1.0, length)
        columns.append(steps / steps.pow(2).sum())
        operator = torch.stack(columns, dim=1).to(device)
        self._operators[key] = operator
        return operator

    def prototype_input(self, window: torch.Tensor) -> torch.Tensor:
        return window[:, -self.prototype_rows:, :].reshape(len(window), -1)

    def prototype_distances(self, window: torch.Tensor) -> torch.Tensor:
        """Distances to the normal prototypes, ascending, in units of their typical within-cluster distance."""
        flat = self.prototype_input(window)
        distances = torch.cdist(flat, self.prototypes) / self.prototype_scale
        return torch.sort(distances, dim=1).values

    @torch.no_grad()
    def set_prototypes(self, normal_windows: torch.Tensor, seed: int = 0) -> None:
        """k-means centroids of normal contexts; the scale is the median distance of a normal context to its
        nearest centroid, so distances read the same for any metric count."""
        from sklearn.cluster import MiniBatchKMeans

        flat = self.prototype_input(normal_windows).numpy()
        k = min(self.n_prototypes, len(flat))
        km = MiniBatchKMeans(n_clusters=k, random_state=seed, n_init=3).fit(flat)
        centres = torch.from_numpy(km.cluster_centers_.astype("float32"))
        if k < self.n_prototypes:
            centres = torch.cat([centres, centres[:1].repeat(self.n_prototypes - k, 1)])
        self.prototypes.copy_(centres)
        nearest = torch.cdist(torch.from_numpy(flat), centres).min(dim=1).values
        self.prototype_scale.copy_(nearest.median().clamp(min=1e-6))


class TCEEnsemble(nn.Module):
    """Members trained from different seeds; the prediction averages their logits (a geometric mean of their
    class probabilities). Averaging removes most of the seed-to-seed variance of a model trained on few
    labelled faults."""

    def __init__(self, members: Sequence[TemporalContextEncoder]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, window: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        return torch.stack([member(window, context) for member in self.members]).mean(dim=0)


class TCEDetector(BaseDetector):
    """TCE behind the detector interface: ``fit`` on labelled windows, ``score`` = 1 - p(normal).

    ``X`` is (n, history, features) windows or a ``WindowSet``; ``y`` is the class index per window (0 normal);
    ``context`` is (n, n_context) or None.
    """

    name: ClassVar[str] = "tce"

    def __init__(self, recent: int = 30, history: int = 288, scales: tuple[int, ...] = (12, 48),
                 hidden: int = 32, heads: int = 4, use_history: bool = True, use_context: bool = True,
                 prototypes: int = 16, weight_mode: WeightMode = "dynamic", gamma: float = 1.0, epochs: int = 10,
                 batch_size: int = 256, lr: float = 2e-3, patience: int = 3, steps_per_epoch: int | None = None,
                 seed: int = 0, members: int = 1, window_context: bool = False, memory: int = 0,
                 memory_rows: int = 10, embedding: int = 0, augment: float = 0.0,
                 mix: Sequence[float] = (1.0, 0.0, 0.0, 0.0), smooth: int = 1, combine: str = "rank",
                 own_memory: int = 0) -> None:
        self.recent = recent
        self.history = history
        self.scales = scales
        self.hidden = hidden
        self.heads = heads
        self.use_history = use_history
        self.use_context = use_context
        self.prototypes = prototypes
        self.weight_mode = weight_mode
        self.gamma = gamma
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.patience = patience
        self.steps_per_epoch = steps_per_epoch
        self.seed = seed
        self.members = members
        self.window_context = window_context
        self.memory = memory
        self.memory_rows = memory_rows
        self.embedding = embedding
        self.augment = augment
        self.mix = full_mix(mix)
        self.smooth = smooth
        self.combine = combine
        self.own_memory = own_memory

    def member_seeds(self) -> list[int]:
        """Disjoint seeds per detector seed: seed 0 trains members 0..k-1, seed 1 members k..2k-1."""
        return [self.seed * self.members + i for i in range(self.members)] if self.members > 1 else [self.seed]

    def build_model(self, n_features: int, n_classes: int, n_context: int) -> nn.Module:
        """One encoder, or an ensemble of ``members`` encoders."""
        if self.members < 1:
            raise VigilInputError(f"tce: members must be >= 1, got {self.members}")
        models = []
        for seed in self.member_seeds():
            torch.manual_seed(seed)
            models.append(TemporalContextEncoder(n_features, n_classes, recent=self.recent, history=self.history,
                                                 scales=self.scales, hidden=self.hidden, heads=self.heads,
                                                 n_context=n_context, use_history=self.use_history,
                                                 use_context=self.use_context, prototypes=self.prototypes))
        return models[0] if self.members == 1 else TCEEnsemble(models)

    def _as_windows(self, X: Any, y: np.ndarray | None = None, context: np.ndarray | None = None) -> WindowSet:
        if isinstance(X, WindowSet):
            data = X
        else:
            arr = np.asarray(X, dtype=np.float32)
            if arr.ndim != 3:
                raise VigilInputError(f"tce: expected windows of shape (n, {self.history}, features), got {arr.shape}")
            if not np.isfinite(arr).all():
                raise VigilInputError("tce: input holds NaN or infinite values; impute gaps first "
                                      "(docs/detection.md)")
            data = WindowSet.from_array(arr, y, context)
        if data.length != self.history:
            raise VigilInputError(f"tce: windows of {data.length} rows, the model reads {self.history}")
        n_features = getattr(self, "features_", None)
        if n_features is not None and data.n_features != len(n_features):
            raise VigilInputError(f"tce: expected {len(n_features)} features (as at fit time), got {data.n_features}")
        if not self.window_context:
            return data
        parts = [window_features(data.take(np.arange(s, min(s + 4096, len(data)))), self.recent)
                 for s in range(0, len(data), 4096)]
        features = np.concatenate(parts) if parts else np.zeros((0, data.n_features * 6), dtype=np.float32)
        given = data.context
        return data.with_context(features if given is None else np.concatenate([given, features], axis=1))

    def fit(self, X: Any, y: np.ndarray | None = None, *, context: np.ndarray | None = None,
            validation: WindowSet | None = None, classes: Sequence[str] | None = None,
            features: Sequence[str] | None = None, normal_subsample: float = 1.0,
            progress: Progress | None = None) -> Self:
        """Train on labelled windows. ``normal_subsample``: the factor by which normal windows were thinned
        in ``X`` (kept: one in ``normal_subsample``); predictions add ``log(normal_subsample)`` to the normal
        logit, restoring the true prior (logit adjustment) so thinning for speed does not flood false alarms.
        ``augment`` > 0 adds that share of synthetic anomalies (``augment.augmented``: generic deviations
        injected into copies of normal windows) to a two-class training set."""
        if self.augment > 0:
            if y is None and not isinstance(X, WindowSet):
                raise VigilInputError("tce: training needs labels (0 normal, k fault class k)")
            raw = X if isinstance(X, WindowSet) else WindowSet.from_array(np.asarray(X, dtype=np.float32), y, context)
            if int(raw.labels.max(initial=0)) > 1 or (classes is not None and len(classes) > 2):
                raise VigilInputError("tce: augment injects one anomaly class; the training data holds several")
            X, y, context = augmented(raw, self.augment, self.recent, seed=self.seed), None, None
        data = self._as_windows(X, y, context)
        if validation is not None:
            validation = self._as_windows(validation)
        labels = data.labels
        if y is None and not isinstance(X, WindowSet):
            raise VigilInputError("tce: training needs labels (0 normal, k fault class k)")
        n_classes = max(len(classes) if classes else 0, int(labels.max(initial=0)) + 1, 2)
        self.classes_ = list(classes) if classes else ["normal"] + [f"class_{k}" for k in range(1, n_classes)]
        self.features_ = list(features) if features else [f"m{i}" for i in range(data.n_features)]
        ctx = data.context
        self.n_context_ = 0 if ctx is None else int(ctx.shape[1])
        self.scaler_ = Scaler.fit(data.last_rows(seed=self.seed))
        self.model_ = self.build_model(data.n_features, n_classes, self.n_context_)
        counts = torch.bincount(torch.from_numpy(labels), minlength=n_classes)
        self.logit_bias_ = [float(np.log(max(normal_subsample, 1.0)))] + [0.0] * (n_classes - 1)
        encoders = [m for m in self.model_.modules() if isinstance(m, TemporalContextEncoder)]
        normal = np.flatnonzero(labels == 0)
        reports, weights = [], []
        for seed, encoder in zip(self.member_seeds(), encoders, strict=True):
            if self.prototypes:
                pick = np.sort(np.random.default_rng(seed).choice(normal, min(len(normal), 20000), replace=False))
                encoder.set_prototypes(torch.from_numpy(self.scaler_.transform(data.take(pick, last=self.recent))),
                                       seed=seed)
            loss_fn = DynamicClassWeightedLoss(n_classes, self.weight_mode, gamma=self.gamma, class_counts=counts,
                                               normal_subsample=normal_subsample)
            reports.append(fit_classifier(
                encoder, loss_fn, data, validation, self.scaler_, epochs=self.epochs,
                batch_size=self.batch_size, lr=self.lr, patience=self.patience,
                steps_per_epoch=self.steps_per_epoch, seed=seed, logit_bias=self.logit_bias_, progress=progress))
            weights.append(loss_fn.current_weights())
        self.report_: TrainReport = reports[0]
        if len(reports) > 1:
            self.report_ = ensemble_report(reports, self.model_, validation, self.scaler_, self.logit_bias_)
        self.class_weights_ = torch.stack(weights).mean(dim=0).tolist()
        self.memory_ = self._fit_memory(data, normal)
        self.embedding_memory_ = self._fit_embedding_memory(data, normal)
        self.threshold_ = 0.5
        return self

    def _fit_memory(self, data: WindowSet, normal: np.ndarray) -> np.ndarray | None:
        """k-means centroids of the newest ``memory_rows`` rows of normal training windows, flattened."""
        if not self.memory:
            return None
        from sklearn.cluster import MiniBatchKMeans

        rng = np.random.default_rng(self.seed)
        pick = np.sort(rng.choice(normal, min(len(normal), MEMORY_FIT_WINDOWS), replace=False))
        flat = data.take(pick, last=self.memory_rows).reshape(len(pick), -1)
        k = min(self.memory, len(flat))
        return np.asarray(MiniBatchKMeans(n_clusters=k, random_state=self.seed, n_init=3).fit(flat).cluster_centers_,
                          dtype=np.float64)

    def _fit_embedding_memory(self, data: WindowSet, normal: np.ndarray) -> np.ndarray | None:
        """k-means centroids of the learned embedding (``embed``) of normal training windows."""
        if not self.embedding:
            return None
        from sklearn.cluster import MiniBatchKMeans

        rng = np.random.default_rng(self.seed + 1)
        pick = np.sort(rng.choice(normal, min(len(normal), EMBEDDING_FIT_WINDOWS), replace=False))
        points = self._embed(data, pick)
        k = min(self.embedding, len(points))
        return np.asarray(MiniBatchKMeans(n_clusters=k, random_state=self.seed, n_init=3).fit(points).cluster_centers_,
                          dtype=np.float64)

    def _embed(self, data: WindowSet, rows: np.ndarray) -> np.ndarray:
        """Hidden-layer embeddings of ``data``'s windows ``rows`` (ensemble members side by side)."""
        encoders = [m for m in self.model_.modules() if isinstance(m, TemporalContextEncoder)]
        context = data.context
        out = []
        self.model_.eval()
        with torch.no_grad():
            for start in range(0, len(rows), 4096):
                idx = rows[start:start + 4096]
                window = torch.from_numpy(self.scaler_.transform(data.take(idx)))
                ctx = torch.from_numpy(context[idx]) if context is not None else None
                out.append(torch.cat([e.embed(window, ctx) for e in encoders], dim=1).numpy())
        width = self.hidden * len(encoders)
        return np.concatenate(out).astype(np.float64) if out else np.zeros((0, width))

    def embedding_distance(self, X: Any) -> np.ndarray:
        """Distance of each window's learned embedding to the nearest centroid of normal training windows'
        embeddings."""
        centroids = getattr(self, "embedding_memory_", None)
        if centroids is None:
            raise VigilInputError("tce: this model has no learned-space memory (embedding=0)")
        data = self._as_windows(X)
        points = self._embed(data, np.arange(len(data)))
        squared = ((points ** 2).sum(axis=1)[:, None] - 2 * points @ centroids.T
                   + (centroids ** 2).sum(axis=1)[None, :])
        return np.sqrt(np.maximum(squared.min(axis=1), 0.0))

    def memory_distance(self, X: Any) -> np.ndarray:
        """Distance of each window's newest ``memory_rows`` rows to the nearest normal-window centroid."""
        centroids = getattr(self, "memory_", None)
        if centroids is None:
            raise VigilInputError("tce: this model has no normal-window memory (memory=0)")
        # The memory reads the windows' rows only: a window set needs no context features computed.
        data = X if isinstance(X, WindowSet) and X.length == self.history else self._as_windows(X)
        out = []
        for start in range(0, len(data), 4096):
            rows = data.take(np.arange(start, min(start + 4096, len(data))), last=self.memory_rows)
            flat = rows.reshape(len(rows), -1).astype(np.float64)
            squared = ((flat ** 2).sum(axis=1)[:, None] - 2 * flat @ centroids.T
                       + (centroids ** 2).sum(axis=1)[None, :])
            out.append(np.sqrt(np.maximum(squared.min(axis=1), 0.0)))
        return np.concatenate(out) if out else np.zeros(0)

    def own_memory_distance(self, X: Any, reference: Any) -> tuple[np.ndarray, np.ndarray]:
        """The own-history memory: k-means (``own_memory`` centroids) of the newest ``memory_rows`` rows of the
        older ``OWN_FIT_SHARE`` of ``reference`` (windows of this machine's unlabelled history, oldest first),
        inputs as fed; returns the distance to the nearest centroid of every window of ``X`` and of the newer
        rest of ``reference`` (out of sample, the reference this part is read against). Fitted per machine
        when it is scored, from nothing but its own history: what a deployment has of a new machine."""
        if not self.own_memory:
            raise VigilInputError("tce: this model has no own-history memory (own_memory=0)")
        from sklearn.cluster import MiniBatchKMeans

        history = reference if isinstance(reference, WindowSet) else self._as_windows(reference)
        data = X if isinstance(X, WindowSet) and X.length == self.history else self._as_windows(X)
        n = len(history)
        cut = int(round(n * OWN_FIT_SHARE))
        if cut < 2 or n - cut < 2:
            raise VigilInputError(f"tce: the own-history memory needs at least 4 history windows, got {n}")
        fit = history.take(np.arange(cut), last=self.memory_rows).reshape(cut, -1).astype(np.float64)
        k = min(self.own_memory, cut)
        centroids = MiniBatchKMeans(n_clusters=k, random_state=self.seed, n_init=3).fit(fit).cluster_centers_

        def nearest(windows: WindowSet, rows: np.ndarray) -> np.ndarray:
            out = []
            for start in range(0, len(rows), 4096):
                flat = windows.take(rows[start:start + 4096], last=self.memory_rows)
                flat = flat.reshape(len(flat), -1).astype(np.float64)
                squared = ((flat ** 2).sum(axis=1)[:, None] - 2 * flat @ centroids.T
                           + (centroids ** 2).sum(axis=1)[None, :])
                out.append(np.sqrt(np.maximum(squared.min(axis=1), 0.0)))
            return np.concatenate(out) if out else np.zeros(0)

        return nearest(data, np.arange(len(data))), nearest(history, np.arange(cut, n))

    def score_components_available(self) -> list[str]:
        """The parts of ``COMPONENTS`` this model has (``score_components``; ``own`` is read with a history,
        ``read_parts``)."""
        return [name for name, has in zip(COMPONENTS, (True, bool(self.prototypes),
                                                       getattr(self, "memory_", None) is not None,
                                                       getattr(self, "embedding_memory_", None) is not None,
                                                       bool(getattr(self, "own_memory", 0))),
                                          strict=True)
                if has]

    def read_parts(self, X: Any, reference: Any) -> tuple[PartReadings, dict[str, np.ndarray]]:
        """Every part of the score of windows ``X`` of one machine, with the own-history part when the model has
        one, read against ``reference`` (windows of the machine's unlabelled history, oldest first); returns
        the readings and the raw parts on ``X``."""
        parts = self.score_components(X)
        history = self.score_components(reference)
        if getattr(self, "own_memory", 0):
            parts["own"], history["own"] = self.own_memory_distance(X, reference)
        return PartReadings.read(parts, history), parts

    def score_components(self, X: Any) -> dict[str, np.ndarray]:
        """Every part of the anomaly score this model has: ``supervised`` (1 - p(normal)), ``novelty``
        (prototypes), ``memory`` (normal-window centroids) and ``embedding`` (centroids in the learned
        space). One pass: the window features once, one forward pass of each member for the class
        probabilities and the embedding (the same values ``predict_proba``, ``novelty`` and
        ``embedding_distance`` give one by one)."""
        if getattr(self, "model_", None) is None:
            raise VigilInputError("tce: fit or load the model first")
        data = self._as_windows(X)
        if self.n_context_ and data.context is None:
            raise VigilInputError(f"tce: the model reads {self.n_context_} context features per window; none given")
        encoders = [m for m in self.model_.modules() if isinstance(m, TemporalContextEncoder)]
        centroids = getattr(self, "embedding_memory_", None)
        bias = torch.tensor(getattr(self, "logit_bias_", None) or [0.0] * len(self.classes_))
        context = data.context
        supervised, novelty, embedding = [], [], []
        self.model_.eval()
        with torch.no_grad():
            for start in range(0, len(data), 4096):
                idx = np.arange(start, min(start + 4096, len(data)))
                window = torch.from_numpy(self.scaler_.transform(data.take(idx)))
                ctx = torch.from_numpy(context[idx]) if context is not None else None
                hidden = [e.embed(window, ctx) for e in encoders]
                logits = torch.stack([e.head[3](e.head[2](h)) for e, h in zip(encoders, hidden, strict=True)])
                probability = torch.softmax(logits.mean(dim=0) + bias, dim=1)
                supervised.append(1.0 - probability[:, 0].numpy().astype(np.float64))
                if self.prototypes:
                    nearest = [torch.log1p(e.prototype_distances(window)[:, 0]) for e in encoders]
                    novelty.append(torch.stack(nearest).mean(dim=0).numpy().astype(np.float64))
                if centroids is not None:
                    points = torch.cat(hidden, dim=1).numpy().astype(np.float64)
                    squared = ((points ** 2).sum(axis=1)[:, None] - 2 * points @ centroids.T
                               + (centroids ** 2).sum(axis=1)[None, :])
                    embedding.append(np.sqrt(np.maximum(squared.min(axis=1), 0.0)))
        parts = {"supervised": np.concatenate(supervised) if supervised else np.zeros(0)}
        if self.prototypes:
            parts["novelty"] = np.concatenate(novelty) if novelty else np.zeros(0)
        if getattr(self, "memory_", None) is not None:
            parts["memory"] = self.memory_distance(X if isinstance(X, WindowSet) else data)
        if centroids is not None:
            parts["embedding"] = np.concatenate(embedding) if embedding else np.zeros(0)
        return parts

    def relative_score(self, X: Any, reference: Any, mix: Sequence[float] | None = None,
                       smooth: int | None = None, combine: str | None = None) -> np.ndarray:
        """The anomaly score of windows ``X`` of one machine (consecutive windows, oldest first) read against
        ``reference``, windows of the same machine's unlabelled history: the parts weighed by ``mix``
        (supervised, novelty, memory, embedding) combined by the rule ``combine`` (``combine_parts``), then the
        trailing mean over ``smooth`` windows (defaults: the detector's ``mix``, ``smooth`` and ``combine``).
        Needs no label of the machine, so a new machine is scored as soon as it has a history."""
        readings, _ = self.read_parts(X, reference)
        mixed = combine_parts(readings, self.mix if mix is None else mix, self.combine if combine is None else combine)
        return trailing_mean(mixed, self.smooth if smooth is None else smooth)

    def novelty(self, X: Any, context: np.ndarray | None = None) -> np.ndarray:
        """``log(1 + d)`` with ``d`` the distance of each window's recent context to the nearest normal
        prototype (in units of the typical normal distance), averaged over ensemble members."""
        if getattr(self, "model_", None) is None:
            raise VigilInputError("tce: fit or load the model first")
        encoders = [m for m in self.model_.modules() if isinstance(m, TemporalContextEncoder)]
        if not encoders[0].n_prototypes:
            raise VigilInputError("tce: this model has no normal-context memory (prototypes=0), so no novelty")
        data = self._as_windows(X, None, context)
        out = []
        with torch.no_grad():
            for start in range(0, len(data), 4096):
                rows = np.arange(start, min(start + 4096, len(data)))
                recent = torch.from_numpy(self.scaler_.transform(data.take(rows, last=encoders[0].prototype_rows)))
                nearest = [torch.log1p(e.prototype_distances(recent)[:, 0]) for e in encoders]
                out.append(torch.stack(nearest).mean(dim=0).numpy())
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    def predict_proba(self, X: Any, context: np.ndarray | None = None) -> np.ndarray:
        if getattr(self, "model_", None) is None:
            raise VigilInputError("tce: fit or load the model first")
        data = self._as_windows(X, None, context)
        if self.n_context_ and data.context is None:
            raise VigilInputError(f"tce: the model reads {self.n_context_} context features per window; none given")
        return predict_proba(self.model_, data, self.scaler_, logit_bias=getattr(self, "logit_bias_", None))

    def decision_function(self, X: Any, context: np.ndarray | None = None) -> np.ndarray:
        """``1 - p(normal)``: the classifier's score, which needs no history of the machine
        (``relative_score`` reads a machine against its own history)."""
        return 1.0 - self.predict_proba(X, context)[:, 0]

    def score_parts(self, X: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """``1 - p(normal)`` and the novelty (None without prototypes), so a caller can weigh them itself."""
        supervised = (1.0 - self.predict_proba(X)[:, 0]).astype(np.float64)
        return supervised, (self.novelty(X).astype(np.float64) if self.prototypes else None)

    def save(self, path: Path) -> None:
        """Write the fitted detector to the directory ``path`` (``model.pt`` + ``meta.json``)."""
        save_detector(self, path)

    @classmethod
    def load(cls, path: Path) -> Self:
        """A detector saved by ``save``; weights read with ``weights_only=True``, never unpickled."""
        detector = load_detector(path)
        if not isinstance(detector, cls):
            raise VigilInputError(f"{path}: holds a {type(detector).__name__}, not a {cls.__name__}")
        return detector

    def predict_class(self, X: Any, context: np.ndarray | None = None) -> np.ndarray:
        return self.predict_proba(X, context).argmax(axis=1)


# The saved form: model.pt (weights, loaded with weights_only) and meta.json (everything else).
def save_detector(detector: TCEDetector, path: Path) -> None:
    if getattr(detector, "model_", None) is None:
        raise VigilInputError("cannot save an untrained detector; fit it first")
    path.mkdir(parents=True, exist_ok=True)
    torch.save(detector.model_.state_dict(), path / "model.pt")
    meta: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "detector": detector.name,
        "params": detector.get_params(),
        "features": list(detector.features_),
        "classes": list(detector.classes_),
        "scaler": {"mean": detector.scaler_.mean.tolist(), "std": detector.scaler_.std.tolist()},
        "threshold": float(detector.threshold_),
        "n_context": int(detector.n_context_),
        "logit_bias": list(detector.logit_bias_),
        "choice": getattr(detector, "choice_", None),
        "memory": (None if getattr(detector, "memory_", None) is None
                   else np.asarray(detector.memory_).tolist()),
        "embedding_memory": (None if getattr(detector, "embedding_memory_", None) is None
                             else np.asarray(detector.embedding_memory_).tolist()),
        "report": asdict(detector.report_),
    }
    tmp = path / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(path / "meta.json")


def load_detector(path: Path) -> TCEDetector:
    try:
        meta = json.loads((path / "meta.json").read_text())
    except FileNotFoundError:
        raise VigilInputError(f"no trained model at {path} (meta.json missing)") from None
    except json.JSONDecodeError as err:
        raise VigilInputError(f"{path / 'meta.json'}: corrupt model metadata ({err.msg})") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise VigilInputError(f"{path}: model format version {meta.get('format_version')!r}, this Vigil reads "
                              f"{FORMAT_VERSION}; retrain with `vigil detect train`")
    detector = TCEDetector(**meta["params"])
    detector.features_ = list(meta["features"])
    detector.classes_ = list(meta["classes"])
    detector.scaler_ = Scaler(np.asarray(meta["scaler"]["mean"], dtype=np.float32),
                              np.asarray(meta["scaler"]["std"], dtype=np.float32))
    detector.threshold_ = float(meta["threshold"])
    detector.n_context_ = int(meta["n_context"])
    detector.logit_bias_ = [float(b) for b in meta["logit_bias"]]
    detector.choice_ = meta.get("choice")
    memory = meta.get("memory")
    detector.memory_ = None if memory is None else np.asarray(memory, dtype=np.float64)
    embedded = meta.get("embedding_memory")
    detector.embedding_memory_ = None if embedded is None else np.asarray(embedded, dtype=np.float64)
    detector.report_ = TrainReport(**meta["report"])
    detector.model_ = detector.build_model(len(detector.features_), len(detector.classes_), detector.n_context_)
    try:
        state = torch.load(path / "model.pt", weights_only=True)
        detector.model_.load_state_dict(state)
    except FileNotFoundError:
        raise VigilInputError(f"{path}: model.pt missing") from None
    except (RuntimeError, OSError, EOFError) as err:
        raise VigilInputError(f"{path / 'model.pt'}: does not match its metadata or is corrupt "
                              f"({str(err).splitlines()[0]})") from None
    detector.model_.eval()
    return detector
