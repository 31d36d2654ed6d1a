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
