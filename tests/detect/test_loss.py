"""Dynamic class-weighted loss: the modes, the normalisation, and the recall-driven re-weighting."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from vigil.detect.learned.loss import DynamicClassWeightedLoss

torch.set_num_threads(1)


def test_plain_mode_is_cross_entropy() -> None:
    torch.manual_seed(0)
    logits, target = torch.randn(16, 3), torch.randint(0, 3, (16,))
    loss = DynamicClassWeightedLoss(3, "none")
    assert loss(logits, target).item() == pytest.approx(F.cross_entropy(logits, target).item(), rel=1e-6)
    loss.update(logits, target)
    assert torch.equal(loss.current_weights(), torch.ones(3))


def test_static_weights_favour_rare_classes_and_keep_the_loss_scale() -> None:
    counts = torch.tensor([9000.0, 900.0, 10.0])
    loss = DynamicClassWeightedLoss(3, "static", class_counts=counts)
    w = loss.current_weights()
    assert w[2] > w[1] > w[0]
    freq = counts / counts.sum()
    assert float((w * freq).sum()) == pytest.approx(1.0, rel=1e-5)
    before = w.clone()
    loss.update(torch.randn(8, 3), torch.randint(0, 3, (8,)))
    assert torch.equal(loss.current_weights(), before)


def test_weight_ratio_is_clipped() -> None:
    loss = DynamicClassWeightedLoss(2, "static", class_counts=torch.tensor([1e6, 1.0]), beta=0.999999,
                                    max_ratio=10.0)
    w = loss.current_weights()
    assert float(w[1] / w[0]) == pytest.approx(10.0, rel=1e-4)


def test_dynamic_weights_rise_for_a_class_the_model_misses() -> None:
    counts = torch.tensor([500.0, 50.0, 50.0])
    loss = DynamicClassWeightedLoss(3, "dynamic", class_counts=counts)
    target = torch.tensor([0] * 10 + [1] * 5 + [2] * 5)
    # The model gets class 1 right and class 2 always wrong (predicts normal).
    logits = torch.zeros(20, 3)
    logits[torch.arange(20), torch.where(target == 2, 0, target)] = 5.0
    start = loss.current_weights()
    for _ in range(20):
        loss.update(logits, target)
    end = loss.current_weights()
    assert end[2] / end[1] > 3 * (start[2] / start[1])
    assert float(loss.recall[2]) < 0.1 < 0.9 < float(loss.recall[1])


def test_batches_without_a_class_leave_its_recall_alone() -> None:
    loss = DynamicClassWeightedLoss(3, "dynamic", class_counts=torch.tensor([10.0, 5.0, 5.0]))
    loss.update(torch.tensor([[5.0, 0, 0], [0, 5.0, 0]]), torch.tensor([0, 1]))
    assert float(loss.recall[2]) == 0.5


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError):
        DynamicClassWeightedLoss(1)
    with pytest.raises(ValueError):
        DynamicClassWeightedLoss(3, "focal")  # type: ignore[arg-type]


def test_difficulty_reads_the_probability_of_the_true_class_not_the_argmax() -> None:
    # Every example is right by argmax, but class 2 only just: its weight must still rise over class 1's.
    loss = DynamicClassWeightedLoss(3, "dynamic", class_counts=torch.tensor([100.0, 50.0, 50.0]))
    target = torch.tensor([0, 0, 1, 1, 2, 2])
    logits = torch.zeros(6, 3)
    logits[torch.arange(6), target] = torch.tensor([6.0, 6.0, 6.0, 6.0, 0.2, 0.2])
    for _ in range(30):
        loss.update(logits, target)
    assert float(loss.recall[2]) < 0.5 < 0.95 < float(loss.recall[1])
    w = loss.current_weights()
    assert w[2] > 3 * w[1]


def test_false_alarms_count_at_the_unthinned_rate() -> None:
    # One normal window in 20 is a false alarm on the training batch; with normal windows thinned one in 20
    # that is every normal window of the real stream, so the normal class must gain weight over the same
    # loss that believes the batch is the real distribution.
    target = torch.tensor([0] * 20 + [1] * 4)
    logits = torch.zeros(24, 2)
    logits[torch.arange(24), target] = 8.0
    logits[0] = torch.tensor([0.0, 8.0])  # the false alarm
    plain = DynamicClassWeightedLoss(2, "dynamic", class_counts=torch.tensor([200.0, 40.0]))
    thinned = DynamicClassWeightedLoss(2, "dynamic", class_counts=torch.tensor([200.0, 40.0]), normal_subsample=20)
    for _ in range(30):
        plain.update(logits, target)
        thinned.update(logits, target)
    ratio = lambda loss: float(loss.current_weights()[0] / loss.current_weights()[1])  # noqa: E731
    assert ratio(thinned) > 2 * ratio(plain)
    assert float(thinned.recall[0]) < 0.2 < 0.9 < float(plain.recall[0])
