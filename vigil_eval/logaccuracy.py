"""Log-parser accuracy as the Loghub benchmarks define it: grouping accuracy (GA) and parsing accuracy (PA)."""

from __future__ import annotations

import re
from collections import defaultdict

_WILDCARD_RUN = re.compile(r"<\*>(?:[\s,:;./\-_=@]*<\*>)+")


def grouping_accuracy(predicted: list[str], truth: list[str]) -> float:
    """Share of lines whose predicted group holds exactly the lines of their true template."""
    by_pred: dict[str, set[int]] = defaultdict(set)
    by_truth: dict[str, set[int]] = defaultdict(set)
    for i, (p, t) in enumerate(zip(predicted, truth, strict=True)):
        by_pred[p].add(i)
        by_truth[t].add(i)
    right = sum(len(idx) for idx in by_pred.values() if by_truth[truth[next(iter(idx))]] == idx)
    return right / len(truth)


def parsing_accuracy(templates: list[str], truth: list[str], collapse: bool = False) -> float:
    """Share of lines whose template text equals the true one (``collapse``: adjacent ``<*>`` runs as one)."""

    def norm(text: str) -> str:
        text = " ".join(text.split())
        return _WILDCARD_RUN.sub("<*>", text) if collapse else text

    return sum(norm(a) == norm(b) for a, b in zip(templates, truth, strict=True)) / len(truth)


def _groups(labels: list[str]) -> dict[str, frozenset[int]]:
    found: dict[str, set[int]] = defaultdict(set)
    for i, label in enumerate(labels):
        found[label].add(i)
    return {label: frozenset(idx) for label, idx in found.items()}


def _f1(right: int, predicted: int, actual: int) -> float:
    precision, recall = right / max(predicted, 1), right / max(actual, 1)
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def f1_grouping_accuracy(predicted: list[str], truth: list[str]) -> float:
    """FGA (Loghub-2.0): F1 over templates of the predicted groups that hold exactly the lines of a true one."""
    mine, theirs = _groups(predicted), _groups(truth)
    exact = set(theirs.values())
    return _f1(sum(group in exact for group in mine.values()), len(mine), len(theirs))


def f1_template_accuracy(predicted: list[str], templates: list[str], truth: list[str]) -> float:
    """FTA (Loghub-2.0): F1 over templates of the predicted groups that are exact and whose template text equals
    the true one (whitespace normalised)."""
    mine, theirs = _groups(predicted), _groups(truth)
    text_of = {label: " ".join(label.split()) for label in theirs}
    by_lines = {group: label for label, group in theirs.items()}
    right = 0
    for group in mine.values():
        label = by_lines.get(group)
        if label is not None and " ".join(templates[next(iter(group))].split()) == text_of[label]:
            right += 1
    return _f1(right, len(mine), len(theirs))
