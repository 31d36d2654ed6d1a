"""Dynamic class-weighted cross-entropy for extremely imbalanced fault classes.

Weights are recomputed while training from two running signals (maths in docs/detection.md):

1. class frequency: an exponential moving average ``n_c`` of how many examples of class ``c`` the model has
   seen per batch, turned into the effective-number weight of Cui et al. (CVPR'19),
   ``e_c = (1 - beta) / (1 - beta ** N_c)`` with ``N_c`` the running count scaled to the data set size;
2. class difficulty: a moving average ``r_c`` of the model's recall on class ``c`` (on the training batches,
   from its own predictions), which multiplies the weight by ``(1 - r_c + floor) ** gamma``: a class the
   model already recalls well stops pulling the decision boundary, so rare classes keep recall without the
   flood of false alarms a large static weight causes on the normal class.

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
                 max_ratio: float = 50.0, class_counts: torch.Tensor | None = None) -> None:
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
        predicted = logits.argmax(dim=1)
        correct = torch.bincount(target[predicted == target], minlength=self.n_classes).float()
        batch_recall = correct / batch_counts.clamp(min=1.0)
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
