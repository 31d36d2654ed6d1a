"""Training loop for the learned classifiers: mini-batches, early stopping on validation data, save / load.

A saved model is a directory: ``model.pt`` (the state dict, loaded with ``weights_only=True``) and
``meta.json`` (format version, detector parameters, feature names, scaler, class names, threshold, training
report). Loading checks the format version and the file's presence, and refuses a mismatch in one line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from sklearn.metrics import average_precision_score, f1_score

from vigil.detect.learned.loss import DynamicClassWeightedLoss
from vigil.detect.learned.windows import WindowSet

FORMAT_VERSION = 1
Progress = Callable[[int, int, float], None]


@dataclass
class TrainReport:
    epochs_run: int = 0
    best_epoch: int = 0
    best_validation: float = float("nan")
    validation_metric: str = ""
    seconds: float = 0.0
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass
class Scaler:
    """Per-metric standardisation; a constant metric keeps unit scale so it stays at zero, not infinity."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, rows: np.ndarray) -> Scaler:
        std = rows.std(axis=0)
        return cls(mean=rows.mean(axis=0).astype(np.float32),
                   std=np.where(std < 1e-6, 1.0, std).astype(np.float32))

    def transform(self, x: np.ndarray) -> np.ndarray:
        return (x - self.mean) / self.std


def validation_score(probs: np.ndarray, labels: np.ndarray) -> tuple[str, float]:
    """Average precision of ``1 - p(normal)`` for two classes, macro-F1 of the argmax for more."""
    if probs.shape[1] == 2:
        if labels.max(initial=0) == 0:
            return "neg_normal_score", -float(probs[:, 1].mean())
        return "auc_pr", float(average_precision_score(labels > 0, 1.0 - probs[:, 0]))
    present = np.unique(labels)
    return "macro_f1", float(f1_score(labels, probs.argmax(axis=1), labels=present, average="macro",
                                      zero_division=0))


def predict_proba(model: torch.nn.Module, data: WindowSet, scaler: Scaler, *, batch_size: int = 4096,
                  logit_bias: list[float] | None = None) -> np.ndarray:
    model.eval()
    bias = torch.tensor(logit_bias) if logit_bias is not None else None
    context = data.context
    out = []
    with torch.no_grad():
        for start in range(0, len(data), batch_size):
            idx = np.arange(start, min(start + batch_size, len(data)))
            window = torch.from_numpy(scaler.transform(data.take(idx)))
            ctx = torch.from_numpy(context[idx]) if context is not None else None
            logits = model(window, ctx)
            out.append(torch.softmax(logits + bias if bias is not None else logits, dim=1).numpy())
    return np.concatenate(out) if out else np.zeros((0, 2), dtype=np.float32)


def fit_classifier(model: torch.nn.Module, loss_fn: DynamicClassWeightedLoss, train: WindowSet,
                   validation: WindowSet | None, scaler: Scaler, *, epochs: int = 10, batch_size: int = 256,
                   lr: float = 2e-3, patience: int = 3, steps_per_epoch: int | None = None, seed: int = 0,
                   logit_bias: list[float] | None = None, progress: Progress | None = None) -> TrainReport:
    """Adam on shuffled mini-batches; keep the weights of the best validation epoch, stop after ``patience``
    epochs without improvement. Without validation data every epoch counts and the last one is kept."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    labels = train.labels
    context = train.context
    report = TrainReport()
    best_state: dict[str, torch.Tensor] | None = None
    best = -np.inf
    stale = 0
    started = time.perf_counter()
    n_steps = max(1, len(train) // batch_size)
    if steps_per_epoch is not None:
        n_steps = min(n_steps, steps_per_epoch)
    for epoch in range(1, epochs + 1):
        model.train()
        order = rng.permutation(len(train))
        total = 0.0
        for step in range(n_steps):
            idx = np.sort(order[step * batch_size:(step + 1) * batch_size])
            window = torch.from_numpy(scaler.transform(train.take(idx)))
            target = torch.from_numpy(labels[idx])
            ctx = torch.from_numpy(context[idx]) if context is not None else None
            logits = model(window, ctx)
            loss = loss_fn(logits, target)
            optimiser.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimiser.step()
            loss_fn.update(logits.detach(), target)
            total += float(loss.detach())
        entry = {"epoch": float(epoch), "loss": total / n_steps}
        report.epochs_run = epoch
        if validation is not None and len(validation):
            probs = predict_proba(model, validation, scaler, logit_bias=logit_bias)
            name, value = validation_score(probs, validation.labels)
            entry[name] = value
            report.validation_metric = name
            if value > best:
                best, stale = value, 0
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                report.best_epoch, report.best_validation = epoch, value
            else:
                stale += 1
        report.history.append(entry)
        if progress is not None:
            progress(epoch, epochs, entry["loss"])
        if validation is not None and stale >= patience:
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    else:
        report.best_epoch = report.epochs_run
    report.seconds = time.perf_counter() - started
    return report


def ensemble_report(reports: list[TrainReport], model: torch.nn.Module, validation: WindowSet | None,
                    scaler: Scaler, logit_bias: list[float] | None) -> TrainReport:
    """One report for an ensemble: epochs and seconds of all members, the validation score of the ensemble
    itself (what model selection should compare), each member's history one after the other."""
    report = TrainReport(epochs_run=sum(r.epochs_run for r in reports), best_epoch=reports[0].best_epoch,
                         validation_metric=reports[0].validation_metric, seconds=sum(r.seconds for r in reports),
                         history=[{**h, "member": float(k)} for k, r in enumerate(reports) for h in r.history])
    if validation is not None and len(validation):
        probs = predict_proba(model, validation, scaler, logit_bias=logit_bias)
        report.validation_metric, report.best_validation = validation_score(probs, validation.labels)
    return report
