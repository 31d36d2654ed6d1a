from __future__ import annotations

from vigil_eval.logaccuracy import grouping_accuracy, parsing_accuracy


def test_grouping_accuracy_counts_only_exact_groups() -> None:
    truth = ["A", "A", "B", "C"]
    assert grouping_accuracy(["x", "x", "y", "z"], truth) == 1.0
    # merging B and C into one group loses both lines; splitting A loses both A lines
    assert grouping_accuracy(["x", "x", "y", "y"], truth) == 0.5
    assert grouping_accuracy(["x", "w", "y", "z"], truth) == 0.5


def test_parsing_accuracy_with_and_without_collapsed_wildcards() -> None:
    truth = ["open <*>", "read <*> bytes"]
    assert parsing_accuracy(["open  <*>", "read <*>:<*> bytes"], truth) == 0.5
    assert parsing_accuracy(["open <*>", "read <*>:<*> bytes"], truth, collapse=True) == 1.0
