"""Metrics: hand-checked cases, VUS-PR against a direct reading of its definition, no test-label leakage."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from vigil.model import VigilInputError
from vigil_eval.detection import (
    choose_threshold,
    class_report,
    detection_delay,
    event_recall,
    events,
    point_adjust,
    score_report,
    vus_pr,
)


def reference_vus_pr(labels: np.ndarray, scores: np.ndarray, sliding_window: int, n_thresholds: int = 250) -> float:
    """VUS-PR read literally from the TSB-AD definition, one point and one threshold at a time."""
    n = len(labels)
    spans = events(labels)
    positives = labels.sum()
    ordered = sorted(scores, reverse=True)
    cuts = [ordered[i] for i in np.linspace(0, n - 1, n_thresholds).astype(int)]
    aps = []
    for buffer in range(2 * sliding_window + 1):
        half = buffer // 2
        soft = labels.astype(float).copy()
        for s, e in spans:
            for i in range(e + 1, min(e + half + 1, n)):
                soft[i] += np.sqrt(1 - (i - e) / buffer)
            for i in range(max(s - half, 0), s):
                soft[i] += np.sqrt(1 - (s - i) / buffer)
        soft = np.minimum(soft, 1)
        ranges = []
        for s, e in spans:
            lo, hi = max(s - half, 0), min(e + half, n - 1)
            if ranges and ranges[-1][1] >= lo - 1 + 1 and ranges[-1][1] >= lo:
                ranges[-1] = (ranges[-1][0], hi)
            else:
                ranges.append((lo, hi))
        prev_recall, ap = 0.0, 0.0
        for cut in cuts:
            pred = [1 if x >= cut else 0 for x in scores]
            tp = 0.0
            n_labels = 0.0
            for i in range(n):
                weight = 1.0 if labels[i] else soft[i] * pred[i]
                tp += weight * pred[i]
                n_labels += weight
            hit = sum(1 for lo, hi in ranges if any(pred[lo:hi + 1]))
            p_new = (positives + n_labels) / 2
            recall = min(tp / p_new, 1.0) * hit / len(ranges)
            ap += (recall - prev_recall) * (tp / sum(pred))
            prev_recall = recall
        aps.append(ap)
    return float(np.mean(aps))


def test_events_and_point_adjust() -> None:
    labels = np.array([0, 1, 1, 0, 0, 1, 1, 1, 0, 1])
    assert events(labels) == [(1, 2), (5, 7), (9, 9)]
    pred = np.array([0, 0, 1, 0, 1, 0, 0, 0, 0, 0])
    assert point_adjust(labels, pred).astype(int).tolist() == [0, 1, 1, 0, 1, 0, 0, 0, 0, 0]
    assert event_recall(labels, pred) == pytest.approx(1 / 3)
    assert detection_delay(labels, pred) == 1.0


def test_threshold_comes_from_validation_only() -> None:
    val_labels = np.array([0, 0, 0, 1, 1])
    val_scores = np.array([0.1, 0.2, 0.3, 0.8, 0.9])
    threshold = choose_threshold(val_labels, val_scores)
    assert 0.3 < threshold <= 0.8
    # On test data the same threshold is applied as is, even where a lower one would score better.
    report = score_report(np.array([0, 1, 1]), np.array([0.1, 0.5, 0.9]), threshold)
    assert report["recall"] == 0.5 and report["threshold"] == threshold


def test_threshold_without_validation_anomalies_sits_above_normal_scores() -> None:
    assert choose_threshold(np.zeros(4), np.array([0.1, 0.4, 0.2, 0.3])) > 0.4


def test_vus_pr_perfect_and_matches_reference() -> None:
    labels = np.zeros(200, dtype=int)
    labels[50:60] = 1
    labels[120:125] = 1
    labels[127:140] = 1
    assert vus_pr(labels, labels.astype(float), sliding_window=5) == pytest.approx(1.0)
    rng = np.random.default_rng(3)
    for _ in range(3):
        scores = rng.random(200) + labels * rng.random() * 1.5
        fast = vus_pr(labels, scores, sliding_window=6, n_thresholds=40)
        slow = reference_vus_pr(labels, scores, sliding_window=6, n_thresholds=40)
        assert fast == pytest.approx(slow, abs=1e-9)


def test_vus_pr_rewards_a_score_just_before_the_event_and_random_is_low() -> None:
    labels = np.zeros(300, dtype=int)
    labels[100:110] = 1
    labels[200:215] = 1
    early = np.zeros(300)
    early[97:100] = 1.0
    early[197:200] = 1.0
    point_ap = score_report(labels, early, 0.5, sliding_window=5)["auc_pr"]
    assert vus_pr(labels, early, sliding_window=5) > 1.5 * point_ap
    random = np.random.default_rng(0).random(300)
    assert vus_pr(labels, random, sliding_window=5) < 0.3


def test_point_adjust_inflates_a_random_score() -> None:
    rng = np.random.default_rng(1)
    labels = np.zeros(5000, dtype=int)
    for start in rng.choice(4800, 20, replace=False):
        labels[start:start + 60] = 1
    scores = rng.random(5000)
    report = score_report(labels, scores, threshold=0.9)
    assert report["f1_pa"] > 2 * report["f1"]


def test_bad_scores_are_refused() -> None:
    with pytest.raises(VigilInputError, match="NaN"):
        score_report(np.array([0, 1]), np.array([0.1, np.nan]), 0.5)
    with pytest.raises(VigilInputError, match="scores for"):
        score_report(np.array([0, 1, 0]), np.array([0.1, 0.2]), 0.5)


def test_class_report_macro_f1() -> None:
    true = np.array([0, 0, 1, 1, 2, 2])
    pred = np.array([0, 0, 1, 0, 2, 2])
    report = class_report(true, pred, ["normal", "a", "b"])
    assert report["per_class"]["a"]["recall"] == 0.5
    assert report["macro_f1"] == pytest.approx(np.mean([0.8, 2 / 3, 1.0]))


def fleet_of_servers(n: int = 6, seed: int = 0, rows: int = 240) -> Any:
    """Servers with their own offset and scale; anomalies are bursts on metric 0 in the labelled part."""
    from vigil_eval.datasets import Dataset, EntitySeries

    rng = np.random.default_rng(seed)
    entities = {}
    for k in range(n):
        offset, scale = rng.uniform(-3, 3), rng.uniform(0.5, 2.0)
        history = offset + scale * rng.normal(size=(rows, 3))
        test = offset + scale * rng.normal(size=(rows, 3))
        labels = np.zeros(rows, dtype=np.int64)
        for start in rng.choice(np.arange(20, rows - 10, 20), size=3, replace=False):
            labels[start:start + 5] = 1
            test[start:start + 5, 0] += 4 * scale
        entities[f"m{k}"] = EntitySeries(entity=f"m{k}", test=test.astype(np.float32), test_labels=labels,
                                         train=history.astype(np.float32))
    return Dataset(name="toy", features=["a", "b", "c"], classes=["normal", "anomaly"], entities=entities)


def test_machine_groups_cover_every_machine_once() -> None:
    from vigil_eval.detection import machine_groups

    names = [f"m{k}" for k in range(14)]
    groups = machine_groups(names, 4, seed=3)
    assert sorted(n for g in groups for n in g) == sorted(names) and {len(g) for g in groups} == {3, 4}
    assert groups == machine_groups(names, 4, seed=3) != machine_groups(names, 4, seed=4)
    with pytest.raises(VigilInputError, match="cannot make"):
        machine_groups(names[:2], 3, seed=0)


def test_relative_scores_keep_the_order_and_read_against_the_machine_history() -> None:
    from vigil_eval.detection import relative_scores

    reference = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    scores = np.array([3.0, 9.0, 1.0])
    relative = relative_scores(scores, reference)
    assert np.allclose(relative, [0.0, 3.0, -1.0])
    assert np.isfinite(relative_scores(scores, np.ones(5))).all()


def test_per_machine_standardisation_uses_the_history_only() -> None:
    from vigil_eval.detection import standardise_per_machine

    dataset = fleet_of_servers()
    standard = standardise_per_machine(dataset)
    for name, series in standard.entities.items():
        assert series.train is not None
        assert np.allclose(series.train.mean(axis=0), 0, atol=1e-5) and np.allclose(series.train.std(axis=0), 1,
                                                                                      atol=1e-4)
        original = dataset.entities[name]
        assert original.train is not None
        expected = (original.test - original.train.mean(axis=0)) / original.train.std(axis=0)
        assert np.allclose(series.test, expected, atol=1e-5)


def test_robust_standardisation_reads_median_and_interquartile_range() -> None:
    from vigil_eval.detection import IQR_TO_SD, standardise_per_machine

    dataset = fleet_of_servers(n=2)
    series = dataset.entities["m0"]
    assert series.train is not None
    series.train[::50, 1] = 1e4  # spikes in the history move the mean and spread, not the median and quartiles
    robust = standardise_per_machine(dataset, robust=True).entities["m0"]
    q25, median, q75 = np.percentile(series.train, [25, 50, 75], axis=0)
    assert np.allclose(robust.test, (series.test - median) / ((q75 - q25) / IQR_TO_SD), atol=1e-4)
    plain = standardise_per_machine(dataset).entities["m0"]
    assert plain.test[:, 1].std() < 0.01 and 0.5 < robust.test[:, 1].std() < 2


@pytest.mark.parametrize("selection", ["one-se", "best"])
def test_nested_protocol_scores_each_machine_once_and_never_reads_test_labels(selection: str) -> None:
    from vigil_eval.detection import candidates_for, fold_spread, nested_leave_machines_out

    dataset = fleet_of_servers()
    run: dict[str, Any] = dict(outer=3, inner=2, history=12, seed=0, selection=selection)
    result = nested_leave_machines_out(dataset, candidates_for("pca"), **run)
    for choice in result.choices:
        assert choice["selection"] == selection
        # The pair taken is within one standard error of the best inner mean (and is the best under "best").
        assert choice["inner_auc_pr"] >= choice["best_inner_auc_pr"] - choice["inner_se"] - 1e-12
        if selection == "best":
            assert choice["inner_auc_pr"] == choice["best_inner_auc_pr"]
    assert sorted(r["entity"] for r in result.rows) == sorted(dataset.entities)
    for choice in result.choices:
        development = {n for group in choice["inner_folds"] for n in group}
        assert development == set(dataset.entities) - set(choice["test"]) and choice["candidate"].startswith("pca[")
    # Scramble every label of the first outer fold's test machines: every choice made for that fold
    # (scaling, threshold) stays the same, only its scores on them change.
    first = result.choices[0]
    for name in first["test"]:
        series = dataset.entities[name]
        series.test_labels = np.random.default_rng(1).permutation(series.test_labels)
    again = nested_leave_machines_out(dataset, candidates_for("pca"), **run)
    assert again.choices[0]["threshold"] == first["threshold"]
    assert again.choices[0]["candidate"] == first["candidate"]
    assert again.choices[0]["variant"] == first["variant"] and again.choices[0]["inner_se"] == first["inner_se"]
    assert again.choices[0]["inner_grid"] == first["inner_grid"]
    summary = fold_spread(result.rows)["pca"]
    assert summary["folds"] == 3 and summary["auc_pr_sd"] >= 0 and 0 < summary["auc_pr"] <= 1


def test_tce_variants_mix_its_parts_read_against_the_machines_history() -> None:
    from vigil.detect.learned.tce import agreement_weights, history_rank, tail_standardise, trailing_mean
    from vigil_eval.detection import (
        COMBINED_GRID,
        MIX_GRID,
        SMOOTHING_ROWS,
        Candidate,
        fit_candidate,
        history_windows,
        labelled_windows,
        variant_scores,
    )

    dataset = fleet_of_servers(n=3)
    candidate = Candidate("tce[fleet]", "tce", {"history": 12, "recent": 4, "scales": (4,), "hidden": 8,
                                                 "epochs": 1, "steps_per_epoch": 3, "batch_size": 32,
                                                 "window_context": True, "memory": 4, "memory_rows": 3,
                                                 "embedding": 4, "own_memory": 4})
    detector = fit_candidate(candidate, dataset, ["m0", "m1"], history=12, seed=0)
    windows = labelled_windows(dataset.entities["m2"], history=12)
    reference = history_windows(dataset.entities["m2"], history=12, count=200)
    variants = variant_scores(detector, windows, reference)
    assert list(variants) == [f"{mix} smooth={rows}" if rows > 1 else mix for mix in [*MIX_GRID, *COMBINED_GRID]
                              for rows in SMOOTHING_ROWS]
    parts, ref = detector.score_components(windows), detector.score_components(reference)
    assert set(parts) == {"supervised", "novelty", "memory", "embedding"}
    ranks = {k: history_rank(parts[k], ref[k]) for k in parts}
    assert np.allclose(variants["sup"], ranks["supervised"])
    assert np.allclose(variants["2sup+nov+mem"], (2 * ranks["supervised"] + ranks["novelty"] + ranks["memory"]) / 4)
    assert np.allclose(variants["sup+emb+mem"], (ranks["supervised"] + ranks["memory"] + ranks["embedding"]) / 3)
    assert np.allclose(detector.relative_score(windows, reference, mix=(1.0, 0.0, 1.0)), variants["sup+mem"])
    assert np.allclose(detector.relative_score(windows, reference, mix=(1.0, 0.0, 1.0), smooth=6),
                       variants["sup+mem smooth=6"])
    # Mixes without the classifier, for machines where it does not carry over.
    assert np.allclose(variants["nov+mem"], (ranks["novelty"] + ranks["memory"]) / 2)
    # The OR of parts: the largest of each part's score in units of its own history's upper tail.
    tails = {k: tail_standardise(parts[k], ref[k]) for k in parts}
    assert np.allclose(variants["max:sup+mem"], np.maximum(tails["supervised"], tails["memory"]))
    assert np.allclose(detector.relative_score(windows, reference, mix=(1.0, 0.0, 1.0), combine="max", smooth=3),
                       variants["max:sup+mem smooth=3"])
    # Agreement: the rank mean with weights read from the history alone; the labelled windows do not move them.
    weights = agreement_weights({k: history_rank(ref[k], ref[k]) for k in ref},
                                {"supervised": 1.0, "novelty": 1.0, "memory": 1.0})
    total = sum(weights.values())
    assert np.allclose(variants["agree:sup+nov+mem"], sum(w / total * ranks[k] for k, w in weights.items()))
    assert np.allclose(detector.relative_score(windows, reference, mix=(1.0, 1.0, 1.0), combine="agree"),
                       variants["agree:sup+nov+mem"])
    # Scored every 2nd window, 6 rows of smoothing are 3 windows.
    assert np.allclose(variant_scores(detector, windows, reference, stride=2)["sup smooth=6"],
                       trailing_mean(ranks["supervised"], 3))
    # The memory reads windows as fed: a window far from every normal one is far from every centroid.
    assert detector.memory_distance(windows).min() >= 0
    # The own-history part: fitted on the older half of this machine's history windows, read against the newer
    # half (out of sample), combined by rank or max like the others, never by agreement.
    own, own_ref = detector.own_memory_distance(windows, reference)
    assert len(own) == len(windows) and len(own_ref) == len(reference) - round(len(reference) / 2)
    own_rank = history_rank(own, own_ref)
    assert np.allclose(variants["own"], own_rank)
    assert np.allclose(variants["sup+own"], (ranks["supervised"] + own_rank) / 2)
    assert np.allclose(variants["max:mem+own"], np.maximum(tails["memory"], tail_standardise(own, own_ref)))
    assert np.allclose(detector.relative_score(windows, reference, mix=(1.0, 0.0, 1.0, 0.0, 1.0), smooth=3),
                       variants["sup+mem+own smooth=3"])
    with pytest.raises(VigilInputError, match="own-history"):
        detector.relative_score(windows, reference, mix=(1.0, 1.0, 0.0, 0.0, 1.0), combine="agree")


def test_history_rank_reads_scores_against_the_history_and_ranks_beyond_it() -> None:
    from vigil.detect.learned.tce import history_rank

    reference = np.arange(100, dtype=float)
    ranked = history_rank(np.array([-1.0, 49.0, 99.0, 149.5, 199.0]), reference)
    assert ranked[0] == 0 and ranked[1] == pytest.approx(0.5) and ranked[2] == pytest.approx(1.0)
    assert ranked[3] == pytest.approx(1.0 + 50.5 / 49.5) and ranked[4] > ranked[3]
    with pytest.raises(VigilInputError, match="no history"):
        history_rank(np.ones(3), np.zeros(0))


def test_threshold_rule_is_chosen_by_cross_fitting_between_groups_of_machines() -> None:
    from vigil_eval.detection import choose_threshold_rule, mean_machine_f1, per_machine_threshold, rule_threshold

    rng = np.random.default_rng(0)

    def machine(n: int, events: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        labels = np.zeros(n, dtype=np.int64)
        for start in rng.choice(np.arange(0, n - width, 2 * width), events, replace=False):
            labels[start:start + width] = 1
        return labels, rng.normal(size=n) + 2.5 * labels

    # One machine with many anomalies sets the pooled threshold; the mean of per-machine F1 weighs each
    # machine once.
    crowded, sparse = machine(2000, 30, 20), machine(2000, 2, 5)
    pooled = rule_threshold("pooled", [crowded, sparse])
    per_machine = per_machine_threshold([crowded, sparse])
    assert mean_machine_f1([crowded, sparse], per_machine) >= mean_machine_f1([crowded, sparse], pooled) - 1e-12
    # Brute force over every score as a threshold finds no better mean (up to the quantile grid).
    cuts = np.unique(np.concatenate([crowded[1], sparse[1]]))[::7]
    assert mean_machine_f1([crowded, sparse], per_machine) >= max(
        mean_machine_f1([crowded, sparse], c) for c in cuts) - 0.02
    groups = [[machine(1500, 20, 20), machine(1500, 2, 5)], [machine(1500, 20, 20), machine(1500, 2, 5)]]
    rule, threshold, evidence = choose_threshold_rule(groups)
    assert set(evidence) == {"pooled", "per-machine"} and rule == max(evidence, key=evidence.get)
    assert threshold == rule_threshold(rule, [m for g in groups for m in g])
    # Machines without any anomaly: the largest score, alarms only above anything seen.
    quiet = [(np.zeros(50, dtype=np.int64), rng.normal(size=50)) for _ in range(2)]
    assert per_machine_threshold(quiet) > max(sc.max() for _, sc in quiet)
    with pytest.raises(VigilInputError, match="threshold rule"):
        rule_threshold("oracle", groups[0])


def test_one_se_rule_takes_the_simplest_pair_within_one_standard_error_of_the_best() -> None:
    from vigil_eval.detection import select_pair

    complex_pair, middle_pair = (0, "agree:sup+nov+mem"), (0, "sup+nov")
    simple_pair, simplest_pair = (0, "sup"), (1, "mem")
    per_machine = {
        complex_pair: [0.60, 0.40, 0.50, 0.70],  # best mean 0.55, sd 0.129, se 0.0645: eligible from 0.4855
        middle_pair: [0.55, 0.45, 0.50, 0.60],   # 0.525: eligible, simpler than the best
        simple_pair: [0.50, 0.40, 0.50, 0.60],   # 0.50: eligible, one part
        simplest_pair: [0.50, 0.40, 0.45, 0.50],  # 0.4625: one part too, but outside one standard error
    }
    complexity = {complex_pair: (3, 4, 0, 1, 0), middle_pair: (2, 1, 0, 1, 0), simple_pair: (1, 0, 0, 1, 0),
                  simplest_pair: (1, 0, 0, 1, 0)}
    picked = select_pair(per_machine, complexity, "one-se")
    assert picked.best == complex_pair and picked.best_mean == pytest.approx(0.55)
    assert picked.se == pytest.approx(np.std([0.6, 0.4, 0.5, 0.7], ddof=1) / 2) and picked.eligible == 3
    assert picked.key == simple_pair
    assert select_pair(per_machine, complexity, "best").key == complex_pair
    # Equally simple eligible pairs: the higher mean; equal means too: the pair listed first.
    per_machine[simplest_pair] = [0.55, 0.45, 0.50, 0.60]
    assert select_pair(per_machine, complexity, "one-se").key == simplest_pair
    tied = {(0, "a"): [0.5, 0.5], (1, "b"): [0.5, 0.5]}
    assert select_pair(tied, {k: (1, 0, 0, 1, 0) for k in tied}).key == (0, "a")
    # One held-out machine: no standard error, the rule is the best mean.
    single = {(0, "x"): [0.6], (0, "y"): [0.59]}
    assert select_pair(single, {(0, "x"): (2, 1, 0, 1, 0), (0, "y"): (1, 0, 0, 1, 0)}).key == (0, "x")
    with pytest.raises(VigilInputError, match="selection rule"):
        select_pair(per_machine, complexity, "oracle")


def test_scaling_free_rule_takes_the_better_scaling_among_equally_simple_pairs() -> None:
    from vigil_eval.detection import select_pair

    # SMD's inner folds in small: a two-part best pair, a fleet-scaled and a per-machine-scaled single part
    # within one standard error of it, the per-machine one with the higher mean.
    best_pair, fleet_own, machine_mem = (0, "sup+mem"), (1, "own"), (2, "mem")
    smoothed = (2, "mem smooth=3")
    per_machine = {
        best_pair: [0.70, 0.40, 0.60, 0.50],    # mean 0.55, se 0.0645: eligible from 0.4855
        fleet_own: [0.55, 0.40, 0.50, 0.50],    # 0.4875: eligible, fleet inputs
        machine_mem: [0.60, 0.45, 0.55, 0.50],  # 0.525: eligible, per-machine inputs, higher mean
        smoothed: [0.62, 0.45, 0.55, 0.50],     # 0.53: eligible, per-machine inputs, higher still, but smoothed
    }
    complexity = {best_pair: (2, 1, 0, 1, 1), fleet_own: (1, 0, 0, 1, 0), machine_mem: (1, 0, 0, 1, 1),
                  smoothed: (1, 0, 0, 3, 1)}
    assert select_pair(per_machine, complexity, "best").key == best_pair
    # The 2026-12-06 rule: fleet inputs rank as simpler and win at the lower mean.
    assert select_pair(per_machine, complexity, "one-se").key == fleet_own
    # Scaling not counted: the two single unsmoothed parts tie on complexity and the higher mean wins; the
    # smoothing still counts, so the smoothed pair's higher mean does not win.
    picked = select_pair(per_machine, complexity, "one-se-scaling-free")
    assert picked.key == machine_mem and picked.best == best_pair and picked.eligible == 4
    # With the per-machine pair outside one standard error, the fleet pair is taken under either rule.
    per_machine[machine_mem] = [0.45, 0.40, 0.45, 0.45]
    assert select_pair(per_machine, complexity, "one-se-scaling-free").key == fleet_own


def test_selection_complexity_follows_the_pre_registered_order() -> None:
    from vigil_eval.detection import COMBINED_GRID, MIX_GRID, Candidate, selection_complexity

    fleet, machine, robust = (Candidate(f"tce[{n}]", "tce", {}, n) for n in ("fleet", "machine", "robust"))
    augmented = Candidate("tce+aug0.05[fleet]", "tce", {"augment": 0.05}, "fleet")

    def tce(label: str, smooth: int = 1, candidate: Candidate = fleet) -> tuple[int, ...]:
        rule, mix = COMBINED_GRID[label] if label in COMBINED_GRID else ("rank", MIX_GRID[label])
        return selection_complexity(candidate, {"mix": mix, "combine": rule, "smooth": smooth})

    # Parts first, then the combination, augmentation, smoothing, scaling.
    assert tce("mem", 48, robust) < tce("sup+nov") < tce("2sup+nov+mem") < tce("sup+nov+mem+emb")
    assert tce("sup+nov") < tce("max:sup+nov") < tce("sup+nov+mem")
    assert tce("sup+nov+mem") < tce("sup+nov+2mem") < tce("max:sup+nov+mem") < tce("agree:sup+nov+mem")
    assert tce("sup", 48) < tce("sup", 1, augmented)
    assert tce("sup", 1, robust) < tce("sup", 3) and tce("sup") < tce("sup", 1, machine) < tce("sup", 1, robust)
    assert tce("sup") == tce("emb") == tce("nov") == (1, 0, 0, 1, 0)
    baseline = Candidate("pca[machine]", "pca", {}, "machine")
    assert selection_complexity(baseline, {"mix": None, "combine": None, "smooth": 12}) == (1, 0, 0, 12, 1)


def test_lomo_inner_folds_hold_each_development_machine_out_once_and_never_fit_on_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import vigil_eval.detection as detection

    dataset = fleet_of_servers()
    seen: list[list[str]] = []  # the machines each fit's training windows were read from, in call order
    training_windows = detection.training_windows

    def recording(data: Any, entities: list[str], **kwargs: Any) -> Any:
        seen.append(list(entities))
        return training_windows(data, entities, **kwargs)

    monkeypatch.setattr(detection, "training_windows", recording)
    candidates = detection.candidates_for("pca")
    result = detection.nested_leave_machines_out(dataset, candidates, outer=3, inner=2, history=12, seed=0,
                                                 inner_scheme="lomo")
    assert len(result.choices) == 3 and sorted(r["entity"] for r in result.rows) == sorted(dataset.entities)
    calls = iter(seen)
    for choice in result.choices:
        development = sorted(set(dataset.entities) - set(choice["test"]))
        # One inner fold per development machine, each held out alone, every one exactly once.
        assert choice["inner_scheme"] == "lomo" and choice["inner_folds"] == [[n] for n in development]
        fold = []
        for (held,) in choice["inner_folds"]:
            for _ in candidates:  # every candidate fitted on all the others, never on the held-out machine
                fold.append(next(calls))
                assert fold[-1] == [n for n in development if n != held]
        fold.append(next(calls))
        assert fold[-1] == development  # the winner's refit on every development machine
        assert not set(choice["test"]) & {n for fit in fold for n in fit}  # no fit of the fold reads its test
    assert next(calls, None) is None
    # The default stays the protocol of the reported tables: 2 inner groups.
    assert detection.inner_folds(["a", "b", "c", "d"], 2, 0) == detection.machine_groups(["a", "b", "c", "d"], 2, 0)
    with pytest.raises(VigilInputError, match="inner scheme"):
        detection.inner_folds(["a", "b"], 2, 0, "random")
    with pytest.raises(VigilInputError, match="leave one machine out"):
        detection.inner_folds(["a"], 2, 0, "lomo")


def test_lomo_threshold_rule_scores_each_machine_with_the_rule_chosen_on_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import vigil_eval.detection as detection

    def machine(anomaly: float) -> tuple[np.ndarray, np.ndarray]:
        labels = np.r_[np.zeros(50, dtype=np.int64), np.ones(5, dtype=np.int64)]
        return labels, np.r_[np.zeros(50), np.full(5, anomaly)]

    # Normals at 0 everywhere; the anomalies of a and b score 4, those of c only 2. Left out, c is scored with
    # the thresholds the rules set on a and b: pooled takes the lowest anomaly score there (4) and misses every
    # anomaly of c (F1 0); per-machine takes the first quantile cut above 0 and finds them (F1 1). a and b are
    # found by both rules set on the others. Cross-fitted: pooled (1 + 1 + 0) / 3, per-machine 1.
    a, b, c = machine(4.0), machine(4.0), machine(2.0)
    assert detection.rule_threshold("pooled", [a, b]) == 4.0 and detection.per_machine_threshold([a, b]) < 2.0
    rule, threshold, evidence = detection.choose_threshold_rule([[a], [b], [c]])
    assert evidence == pytest.approx({"pooled": 2 / 3, "per-machine": 1.0})
    assert rule == "per-machine" and threshold == detection.per_machine_threshold([a, b, c])
    # Choosing in-sample (each rule's threshold set on all three, c included) would tie at F1 1 and keep pooled;
    # two groups ({a, b} and {c}) would give pooled (1 + 0) / 2.
    assert detection.mean_machine_f1([a, b, c], detection.rule_threshold("pooled", [a, b, c])) == 1.0
    assert detection.choose_threshold_rule([[a, b], [c]])[2]["pooled"] == pytest.approx(0.5)

    # The inner folds hand the rule one held-out machine per group, with that machine's scores.
    handed: list[list[list[tuple[np.ndarray, np.ndarray]]]] = []
    choose = detection.choose_threshold_rule

    def recording(groups: Any, rules: Any = detection.THRESHOLD_RULES) -> Any:
        handed.append([list(g) for g in groups])
        return choose(groups, rules)

    monkeypatch.setattr(detection, "choose_threshold_rule", recording)
    dataset = fleet_of_servers(n=5)
    development = sorted(dataset.entities)[:4]
    choice = detection.choose_on_inner_folds(detection.scaled_inputs(dataset), detection.candidates_for("pca"),
                                             development, inner=2, history=12, seed=0, inner_scheme="lomo")
    (groups,) = handed
    assert [len(g) for g in groups] == [1, 1, 1, 1]
    for group, name in zip(groups, development, strict=True):
        labels = detection.labelled_windows(dataset.entities[name], history=12).labels
        assert np.array_equal(group[0][0], labels)
    assert choice.rule_f1 == choose(groups)[2] and choice.threshold_rule == choose(groups)[0]


def test_per_machine_kmeans_reads_only_the_scored_machines_own_history(monkeypatch: pytest.MonkeyPatch) -> None:
    from sklearn.metrics import average_precision_score

    import vigil_eval.detection as detection
    from vigil.detect.learned.windows import WindowSet

    dataset = fleet_of_servers()
    candidate = detection.candidates_for("kmeans-own", {"window": 4, "n_clusters": 5})[0]
    fitted = [detection.fit_candidate(candidate, dataset, fit_on, history=12, seed=0)
              for fit_on in (["m1", "m2"], ["m3", "m4", "m5"])]
    machine = dataset.entities["m0"]
    labelled = detection.labelled_windows(machine, history=12)
    reference = detection.history_windows(machine, history=12)
    first, second = (detection.variant_scores(d, labelled, reference) for d in fitted)
    # Whatever the development machines, the scores of m0 are the same: no other machine is read.
    assert first.keys() == second.keys() and all(np.array_equal(first[k], second[k]) for k in first)
    assert average_precision_score(labelled.labels > 0, first[""]) > 0.5  # 0.06 at random
    # A window far from m0's own history scores above every window of its labelled part.
    far = machine.test.copy()
    far[-1] += 100.0
    outlier = WindowSet(12).add(far, history=machine.train, rows=np.array([len(far) - 1]))
    assert detection.variant_scores(fitted[0], outlier, reference)[""][0] > first[""].max()
    # The nested protocol builds no training windows for it: no fit reads any machine's data.
    monkeypatch.setattr(detection, "training_windows", lambda *a, **k: pytest.fail("read training windows"))
    result = detection.nested_leave_machines_out(dataset, detection.candidates_for(
        "kmeans-own", {"window": 4, "n_clusters": 5}), outer=3, inner=2, history=12, seed=0)
    assert sorted(r["entity"] for r in result.rows) == sorted(dataset.entities)
    assert {r["detector"] for r in result.rows} == {"kmeans-own"}
