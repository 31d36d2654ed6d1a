"""Replay candidate severity-screen words (bench/screen_vocabulary.py) on one checkout's triage code.

Run with PYTHONPATH set to the checkout whose code is replayed (a round's first-run commit, or main):
  PYTHONPATH=<checkout> python bench/screen_replay.py --corpus <today's tests/fixtures/logs/real> [--round N]
Each group only raises a line the checkout's screen reads as no error to a generic candidate. Development cases only
(with --round, that round's development half); held-out cases are never run. Prints one JSON object: per
configuration (none, each group, all groups), the development cases triage and the first error line got right.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from screen_vocabulary import CANDIDATES  # noqa: E402

from vigil.knowledge.signatures import any_of  # noqa: E402
from vigil.logs import severity, triage  # noqa: E402
from vigil_eval import realcorpus  # noqa: E402

OLD = severity.strength


def screen(pattern: re.Pattern[str] | None) -> Callable[[str], int]:
    def strength(line: str) -> int:
        grade = OLD(line)
        if grade or pattern is None or severity._NOT_AN_ERROR.search(line):
            return grade
        return severity.GENERIC if pattern.search(line) else 0
    return strength


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--round", type=int)
    args = parser.parse_args()
    cases = [c for c in realcorpus.load_cases(args.corpus) if c.split == "development"
             and (args.round is None or c.batch == args.round)]
    configs: dict[str, str | None] = {"none": None, **CANDIDATES, "all": any_of(CANDIDATES.values())}
    out: dict[str, object] = {}
    for name, pattern in configs.items():
        fn = screen(None if pattern is None else re.compile(pattern))
        setattr(triage, "strength", fn)  # noqa: B010 - the checkout's triage and baseline call it by this name
        setattr(realcorpus, "strength", fn)  # noqa: B010
        right, baseline = [], []
        for case in cases:
            result = triage.triage(case.directory, job=case.id, workers=1)
            if case.accepts(result):
                right.append(case.id)
            naive = realcorpus.naive_root(case)
            if naive is not None and case.is_root(*naive):
                baseline.append(case.id)
        out[name] = {"right": sorted(right), "first_error_line": sorted(baseline)}
    print(json.dumps({"cases": sorted(c.id for c in cases), "configs": out}))


if __name__ == "__main__":
    main()
