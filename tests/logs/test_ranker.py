"""The learned ranker over triage's candidate root lines (vigil_eval.triage_ranker), tried against the rules: its
features, its JSON model, and a protocol that reads only development cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vigil.logs.triage import TriageResult, decide, scan_directory
from vigil_eval import triage_ranker
from vigil_eval.realcorpus import RealCase, load_cases
from vigil_eval.triage_ranker import FEATURES, Candidate, Config, RankerModel, candidates, fit, pick

JOB = """\
2026-11-30 10:00:00,000 INFO step 1 loss 0.5
2026-11-30 10:00:01,000 ERROR RuntimeError: CUDA error: an illegal memory access was encountered
2026-11-30 10:00:04,000 something failed: could not write checkpoint
"""
PEER = """\
2026-11-30 10:00:05,000 [rank1]:[E1130 10:00:05.000] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, \
OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600001 milliseconds before timing out.
"""


def _job(tmp_path: Path) -> tuple[list[Candidate], TriageResult]:
    (tmp_path / "rank_0.log").write_text(JOB)
    (tmp_path / "rank_1.log").write_text(PEER)
    scans = scan_directory(tmp_path, "t", workers=1)
    result = decide(scans, "t", tmp_path)
    return candidates(scans, result), result


def _value(candidate: Candidate, name: str) -> float:
    return candidate.features[FEATURES.index(name)]


def test_candidates_cover_every_kept_line_with_generic_features(tmp_path: Path) -> None:
    found, result = _job(tmp_path)
    by_line = {(c.event.source, c.event.lineno): c for c in found}
    assert set(by_line) == {("rank_0.log", 2), ("rank_0.log", 3), ("rank_1.log", 1)}
    assert all(len(c.features) == len(FEATURES) for c in found)
    root = by_line[("rank_0.log", 2)]
    assert result.root is not None and (result.root.source, result.root.lineno) == ("rank_0.log", 2)
    assert [_value(c, "rules_root") for c in found].count(1.0) == 1 and _value(root, "rules_root") == 1.0
    assert _value(root, "signature_role_root") == 1.0 and _value(root, "first_in_file") == 1.0
    assert _value(root, "earliest") == 1.0 and _value(root, "time_order") == 0.0
    worded = by_line[("rank_0.log", 3)]
    assert _value(worded, "signature") == 0.0 and _value(worded, "worded_specific") == 1.0
    assert _value(worded, "file_position") == 1.0 and _value(worded, "earliest") == 0.0
    echo = by_line[("rank_1.log", 1)]
    assert _value(echo, "echo") == 1.0 and _value(echo, "echo_words") == 1.0 and _value(echo, "time_order") == 1.0


def _model(coef: dict[str, float]) -> RankerModel:
    return RankerModel(FEATURES, tuple(0.0 for _ in FEATURES), tuple(1.0 for _ in FEATURES),
                       tuple(coef.get(n, 0.0) for n in FEATURES), {})


def test_the_highest_score_wins_and_ties_go_to_the_earlier_line(tmp_path: Path) -> None:
    found, _ = _job(tmp_path)
    rules = _model({"rules_root": 1.0}).pick_full(found)
    assert rules is not None and (rules.event.source, rules.event.lineno) == ("rank_0.log", 2)
    echo = _model({"echo": 2.0, "rules_root": 1.0}).pick_full(found)
    assert echo is not None and echo.event.source == "rank_1.log"
    tie = _model({}).pick_full(found)  # every score 0: the earliest candidate in time
    assert tie is not None and (tie.event.source, tie.event.lineno) == ("rank_0.log", 2)
    assert _model({}).pick([]) is None


def test_the_model_is_data_and_a_malformed_one_is_refused(tmp_path: Path) -> None:
    model = _model({"rules_root": 1.5, "echo": -0.5})
    data = json.loads(json.dumps(model.to_json()))
    again = RankerModel.from_json(data)
    assert again == model
    subset = RankerModel.from_json({**data, "features": ["rules_root", "echo"], "mean": [0, 0], "scale": [1, 2],
                                    "coef": [1, -1]})
    found, _ = _job(tmp_path)
    assert subset.select(found[0].features) == (found[0].features[0], found[0].features[FEATURES.index("echo")])
    for broken in ({**data, "kind": "pickle"}, {**data, "features": ["rules_root", "made_up"]},
                   {**data, "coef": data["coef"][:-1]}, {**data, "scale": [0.0] * len(FEATURES)},
                   {**data, "features": list(reversed(FEATURES))}):
        with pytest.raises(ValueError):
            RankerModel.from_json(broken)
    path = tmp_path / "model.json"
    path.write_text(json.dumps(data))
    assert triage_ranker.load_model(path) == model


def test_a_fitted_ranker_learns_to_prefer_the_root_lines_of_development_cases() -> None:
    dev = [triage_ranker.case_data(c) for c in load_cases() if c.split == "development" and c.batch == 7]
    assert dev and all(any(d.labels) for d in dev)
    model = fit(dev, Config("logistic", 1.0, rules_feature=False))
    assert isinstance(model, RankerModel) and "rules_root" not in model.features
    # in-sample, on a dozen cases: far above naming the first candidate of each case
    right = sum(d.right(pick(model, d)) for d in dev)
    first = sum(d.right(0) for d in dev)
    assert right >= len(dev) - 2 and right > first


def test_cross_validation_reads_development_cases_only(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    original = triage_ranker.case_data

    def recording(case: RealCase) -> triage_ranker.CaseData:
        read.append(case.split)
        return original(case)

    monkeypatch.setattr(triage_ranker, "case_data", recording)
    cv = triage_ranker.development_cv((Config("logistic", 1.0, rules_feature=True),))
    assert set(read) == {"development"} and len(read) == cv["cases"]
    run = cv["runs"][0]
    rounds = {c.batch for c in load_cases() if c.split == "development"}  # one fold per round, rounds 3-5 as one
    assert set(run["folds"]) == {"3-5" if 3 <= b <= 5 else str(b) for b in rounds} >= {"1", "2", "3-5", "6", "9"}
    assert sum(f["cases"] for f in run["folds"].values()) == cv["cases"] == run["cases"]
    assert cv["root_among_candidates"] == cv["cases"]  # every development root line is a candidate
    assert 0 <= run["right"] <= cv["cases"]
