"""Dynamic class-weighted cross-entropy for extremely imbalanced fault classes.

Weights are recomputed while training from two running signals (maths in docs/detection.md):

1. class frequency: an exponential moving average ``n_c`` of how many examples of class ``c`` the model has
   seen per batch, turned into the effective-number weight of Cui et al. (CVPR'19),
   ``e_c = (1 - beta) / (1 - beta ** N_c)`` with ``N_c`` the running count scaled to the data set size;
2. class difficulty: a moving average ``r_c`` of the model's soft recall on class ``c`` - the probability it
   gives the true class, averaged over the class's examples in the training batches - which multiplies the
   weight by ``(1 - r_c + floor) ** gamma``: a class the model already recalls confidently stops pulling the
   decision boundary, a class it keeps missing gains weight. The probability, not the argmax, because a hard
   recall saturates at 1 on training data long before the boundary is safe.
3. false alarms count at their real rate: when normal windows were thinned to one in ``normal_subsample`` for
   training, every normal window the model misses stands for ``normal_subsample`` false alarms on the real
   stream, so the normal class's error is scaled by that factor. Without it the rare classes' growing weights
   buy recall with a flood of false alarms.

The weights are normalised so that their average over the running class distribution is 1 (the loss keeps
its scale) and clipped to ``max_ratio`` times the smallest weight.

``static`` mode freezes the effective-number weights of the full training counts; ``none`` is plain
cross-entropy. Those two are the ablation baselines.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

WeightMode = Literal["none", "static", "dynamic"]


class DynamicClassWeightedLoss(nn.Module):
    total: torch.Tensor
    freq: torch.Tensor
    recall: torch.Tensor
    weights: torch.Tensor

    def __init__(self, n_classes: int, mode: WeightMode = "dynamic", *, beta: float = 0.999,
                 gamma: float = 1.0, momentum: float = 0.9, recall_floor: float = 0.1,
                 max_ratio: float = 50.0, class_counts: torch.Tensor | None = None,
                 normal_subsample: float = 1.0) -> None:
        super().__init__()
        if n_classes < 2:
            raise ValueError("a classifier needs at least two classes")
        if mode not in ("none", "static", "dynamic"):
            raise ValueError(f"unknown weight mode {mode!r}")
        self.n_classes = n_classes
        self.mode = mode
        self.beta = beta
        self.gamma = gamma
        self.momentum = momentum
        self.recall_floor = recall_floor
        self.max_ratio = max_ratio
        self.normal_subsample = max(float(normal_subsample), 1.0)
        counts = (class_counts.float() if class_counts is not None else torch.ones(n_classes))
        self.register_buffer("total", counts.sum().clone())
        self.register_buffer("freq", counts / counts.sum())
        self.register_buffer("recall", torch.full((n_classes,), 0.5))
        self.register_buffer("weights", self._effective(counts))

    def _effective(self, counts: torch.Tensor) -> torch.Tensor:
        eff = (1.0 - self.beta) / (1.0 - torch.pow(torch.tensor(self.beta), counts.clamp(min=1.0)))
        return self._normalise(eff, counts / counts.sum())

    def _normalise(self, weights: torch.Tensor, freq: torch.Tensor) -> torch.Tensor:
        weights = torch.minimum(weights, weights.min() * self.max_ratio)
        return weights / (weights * freq).sum().clamp(min=1e-12)

    def current_weights(self) -> torch.Tensor:
        if self.mode == "none":
            return torch.ones(self.n_classes)
        return self.weights.clone()

    @torch.no_grad()
    def update(self, logits: torch.Tensor, target: torch.Tensor) -> None:
        """Fold one batch into the running frequencies and recalls, then recompute the weights."""
        if self.mode != "dynamic":
            return
        batch_counts = torch.bincount(target, minlength=self.n_classes).float()
        seen = batch_counts > 0
        m = self.momentum
        self.freq.mul_(m).add_((1 - m) * batch_counts / batch_counts.sum())
        p_true = torch.softmax(logits.float(), dim=1).gather(1, target[:, None]).squeeze(1)
        batch_recall = torch.zeros(self.n_classes).index_add_(0, target, p_true) / batch_counts.clamp(min=1.0)
        # Class 0 is normal: its misses are false alarms, each standing for ``normal_subsample`` real ones.
        batch_recall[0] = (1.0 - (1.0 - batch_recall[0]) * self.normal_subsample).clamp(min=0.0)
        self.recall[seen] = m * self.recall[seen] + (1 - m) * batch_recall[seen]
        counts = self.freq * self.total
        difficulty = torch.pow(1.0 - self.recall + self.recall_floor, self.gamma)
        self.weights.copy_(self._normalise(self._effective(counts) * difficulty, self.freq))

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        weight = None if self.mode == "none" else self.weights.to(logits.dtype)
        loss = F.cross_entropy(logits, target, weight=weight, reduction="sum")
        # Normalise by the weighted count so batches without a rare class keep the same scale.
        denom = weight[target].sum() if weight is not None else torch.tensor(float(len(target)))
        return loss / denom.clamp(min=1e-12)
