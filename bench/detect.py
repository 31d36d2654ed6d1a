"""Benchmark the learned detectors: ASD protocol (b) with an ablation of TCE's parts, simulated GPU faults
protocol (c) with the full ablation over training seeds, training time and scoring speed. Writes
bench/results/detect.json (about 25 minutes on 2 cores).

    .venv/bin/python bench/detect.py [--seeds 0,1,2] [--sim-seeds 0,1,2,3,4] [--only asd|asd-ablation|sim] [--quick]

Every number comes from this run; baselines run on the same splits with the same threshold rule (best F1 on
validation data only), so the ratios are what to compare on a shared, noisy machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from vigil.detect.learned.tce import TCEDetector, TCEEnsemble
from vigil.sources.replay import decoded_events
from vigil.sources.sim.generator import SimConfig, simulate
from vigil_eval.datasets import load_asd
from vigil_eval.detection import (
    DETECTORS,
    calibration_split,
    class_report,
    fleet_split,
    report_fitted,
    run_detector,
    summarise,
)
from vigil_eval.simdata import GpuCube, gpu_cube, gpu_fault_classes

REPO = Path(__file__).resolve().parents[1]
ASD = REPO.parent / "shared" / "data" / "asd"
OUT = REPO / "bench" / "results" / "detect.json"
console = Console()

ASD_FOLDS = ((["omi-1", "omi-2", "omi-3", "omi-4"], ["omi-5", "omi-6", "omi-7", "omi-8"]),
             (["omi-5", "omi-6", "omi-7", "omi-8"], ["omi-1", "omi-2", "omi-3", "omi-4"]))
ASD_TCE = {"history": 288, "recent": 30, "scales": (12, 48), "epochs": 8, "steps_per_epoch": 100, "members": 3}
SINGLE = "tce (1 model)"
SIM_HISTORY = 120
SIM_TCE = {"history": SIM_HISTORY, "recent": 20, "scales": (10, 40), "epochs": 8, "steps_per_epoch": 100,
           "patience": 3}
SIM_TRAIN_STRIDE = 20
# Jobs of 2 nodes (16 GPUs): with the run's dense fault rate, jobs of half the cluster were down most of the
# time, and a bandwidth fault on a GPU that moves no data cannot show in its metrics.
SIM_JOB_NODES = 2
SIM_TEST_SEEDS = (303, 304, 305)
SIM_TEST_STRIDE = 10
ABLATION: dict[str, dict[str, Any]] = {
    "TCE (dynamic weights, all parts)": {},
    "plain cross-entropy": {"weight_mode": "none"},
    "static effective-number weights": {"weight_mode": "static"},
    "no long-history branch": {"use_history": False},
    "no context features": {"use_context": False},
    "no normal-context memory": {"prototypes": 0},
}


def member_views(det: TCEDetector) -> list[TCEDetector]:
    """Each member of a TCE ensemble as a detector of its own: member ``i`` of seed ``s`` is exactly the single
    model trained with seed ``s * members + i``, so single-model rows cost no extra training."""
    if not isinstance(det.model_, TCEEnsemble):
        return [det]
    views = []
    for seed, member in zip(det.member_seeds(), det.model_.members, strict=True):
        view = copy.copy(det)
        view.model_, view.members, view.seed = member, 1, seed
        views.append(view)
    return views


def tce_selected_on_held_out(train: Any, val: Any, tests: dict[str, Any], seed: int, classes: list[str],
                               candidates: list[dict[str, Any]],
                               tce_split: tuple[Any, Any, Any]) -> tuple[list[dict[str, Any]], float]:
    """Train one TCE per loss candidate on ``tce_split`` (the last training entity held out) and keep the one
    whose calibrated score has the best AUC-PR on that held-out entity: the loss is a hyper-parameter of a
    fleet model, so it is chosen on an entity the model never trained on, never on the test entities. The
    threshold comes from ``val``, as for every detector. Every candidate's rows are kept under
    ``tce[<mode>]``; the selected one is ``tce``. The same choice is made for each ensemble member alone:
    ``tce (1 model)``."""
    fit_on, stop_on, calibration = tce_split
    best: tuple[float, list[dict[str, Any]]] | None = None
    best_single: dict[int, tuple[float, list[dict[str, Any]]]] = {}
    rows: list[dict[str, Any]] = []
    fit_s = 0.0
    for params in candidates:
        det = TCEDetector(seed=seed, **{**ASD_TCE, **params})
        det.fit(fit_on, validation=stop_on, classes=classes, calibration=calibration)
        fit_s += det.report_.seconds
        held_out = det.calibration_[str(det.novelty_weight_)]
        result, _ = report_fitted(det, "tce", val, tests, seed=seed)
        tag = f"tce[{params.get('weight_mode', 'dynamic')}]"
        rows.extend({**r, "detector": tag, "held_out_auc_pr": held_out, "novelty_weight": det.novelty_weight_}
                    for r in result)
        if best is None or held_out > best[0]:
            best = (held_out, result)
        if det.members == 1:
            continue
        for k, view in enumerate(member_views(det)):
            view.calibrate(calibration)
            single, _ = report_fitted(view, SINGLE, val, tests, seed=view.seed)
            member_held_out = view.calibration_[str(view.novelty_weight_)]
            if k not in best_single or member_held_out > best_single[k][0]:
                best_single[k] = (member_held_out, single)
    assert best is not None
    singles = [r for _, result in best_single.values() for r in result]
    return rows + [{**r, "selected_by_held_out_entity": True} for r in best[1]] + singles, fit_s


def asd_protocol_b(seeds: list[int], candidates: list[dict[str, Any]],
                   checkpoint: Any = None, folds: list[int] | None = None) -> dict[str, Any]:
    """Seeds outermost, so a run cut short still holds complete seeds; ``checkpoint(partial)`` after each
    detector saves what is done."""
    dataset = load_asd(ASD)
    rows: list[dict[str, Any]] = []
    timing: dict[str, list[float]] = {}
    chosen = folds if folds is not None else list(range(len(ASD_FOLDS)))
    splits = {k: fleet_split(dataset, *ASD_FOLDS[k], history=ASD_TCE["history"]) for k in chosen}
    tce_splits = {k: calibration_split(dataset, ASD_FOLDS[k][0], history=ASD_TCE["history"]) for k in chosen}
    part: dict[str, Any] = {}
    for seed in seeds:
        for fold, (train, val, tests) in splits.items():
            for name in DETECTORS:
                console.log(f"ASD seed {seed} fold {fold}: {name}")
                if name == "tce":
                    result, fit_s = tce_selected_on_held_out(train, val, tests, seed, dataset.classes, candidates,
                                                               tce_splits[fold])
                else:
                    result, times = run_detector(name, train, val, tests, seed=seed, classes=dataset.classes)
                    fit_s = times["fit_s"]
                for row in result:
                    row["fold"] = fold
                rows.extend(result)
                timing.setdefault(name, []).append(fit_s)
                part = asd_summary(rows, timing, candidates)
                if checkpoint is not None:
                    checkpoint(part)
    return part


ASD_ABLATION: dict[str, dict[str, Any]] = {
    "no long-history branch": {"use_history": False},
    "no normal-context memory": {"prototypes": 0},
}


def asd_ablation(seeds: list[int], checkpoint: Any = None) -> dict[str, Any]:
    """TCE with dynamic weights minus one part, same folds, seeds and ensemble size as ``tce[dynamic]`` in
    protocol (b), so the rows compare directly. (ASD has no context features: that part has no row here.)"""
    dataset = load_asd(ASD)
    splits = [fleet_split(dataset, *fold, history=ASD_TCE["history"]) for fold in ASD_FOLDS]
    tce_splits = [calibration_split(dataset, fold[0], history=ASD_TCE["history"]) for fold in ASD_FOLDS]
    rows: list[dict[str, Any]] = []
    part: dict[str, Any] = {}
    for seed in seeds:
        for fold, (_, val, tests) in enumerate(splits):
            for label, params in ASD_ABLATION.items():
                console.log(f"ASD ablation seed {seed} fold {fold}: {label}")
                fit_on, stop_on, calibration = tce_splits[fold]
                det = TCEDetector(seed=seed, **{**ASD_TCE, "weight_mode": "dynamic", **params})
                det.fit(fit_on, validation=stop_on, classes=dataset.classes, calibration=calibration)
                result, _ = report_fitted(det, f"tce[dynamic] {label}", val, tests, seed=seed)
                rows.extend({**r, "fold": fold} for r in result)
                part = {"results": rows, "summary": summarise(rows), "seeds_done": sorted({r["seed"] for r in rows})}
                if checkpoint is not None:
                    checkpoint(part)
    return part


def asd_summary(rows: list[dict[str, Any]], timing: dict[str, list[float]],
                candidates: list[dict[str, Any]]) -> dict[str, Any]:
    per_seed = {}
    for seed in sorted({r["seed"] for r in rows if r["detector"] == "tce"}):
        mine = [r for r in rows if r["detector"] == "tce" and r["seed"] == seed]
        per_seed[seed] = summarise(mine)["tce"]
    return {"results": rows, "summary": summarise(rows), "tce_per_seed": per_seed,
            "seeds_done": sorted({r["seed"] for r in rows if r["detector"] == "tce"}),
            "fit_seconds": {k: float(np.mean(v)) for k, v in timing.items()},
            "tce_loss_candidates": candidates}


def sim_cube(seed: int, nodes: int, minutes: float) -> GpuCube:
    gpu_types = tuple(gpu_fault_classes()[1:])
    run = simulate(SimConfig(nodes=nodes, gpus=8, minutes=minutes, seed=seed, interval_s=30.0,
                             job_nodes=SIM_JOB_NODES, faults_per_node_hour=1.0, fault_types=gpu_types))
    events = decoded_events(run.topology, run.events, run.logs)
    return gpu_cube((f for tick in run.ticks() for f in tick.frames), events, run.ground_truth,
                    run.topology, gpu_fault_classes())


def evaluate_sim(det: TCEDetector, tests: list[Any], classes: list[str], rare: list[int]) -> dict[str, Any]:
    """Class report over all test runs (normal windows re-weighted by the thinning) plus the false-alarm rate:
    the share of normal windows classified as any fault."""
    truth = np.concatenate([t.labels for t in tests])
    predicted = np.concatenate([det.predict_class(t) for t in tests])
    weights = np.where(truth == 0, float(SIM_TEST_STRIDE), 1.0)
    report = class_report(truth, predicted, classes, sample_weight=weights)
    report["rare_class_recall"] = float(np.mean([report["per_class"][classes[k]]["recall"] for k in rare]))
    normal = truth == 0
    report["false_alarm_rate"] = float((predicted[normal] > 0).mean()) if normal.any() else 0.0
    report["fit_seconds"] = det.report_.seconds
    report["epochs_run"] = det.report_.epochs_run
    return report


def sim_protocol_c(seeds: list[int], quick: bool, checkpoint: Any = None, configs: list[str] | None = None,
                   measure_speed: bool = True) -> dict[str, Any]:
    """Every ablation row trained at every seed (seeds outermost, so a run cut short holds complete seeds):
    a rare class has a handful of faults per run, so one seed's row says little."""
    classes = gpu_fault_classes()
    scale = 0.25 if quick else 1.0
    train_cube = sim_cube(101, int(32 * scale), 480)
    val_cube = sim_cube(202, int(16 * scale), 240)
    test_cubes = [sim_cube(s, int(32 * scale), 480) for s in SIM_TEST_SEEDS]
    tests = [c.window_set(SIM_HISTORY, normal_stride=SIM_TEST_STRIDE, seed=0) for c in test_cubes]
    counts = sum(np.bincount(c.labels.ravel(), minlength=len(classes)) for c in test_cubes)
    share = counts / counts.sum()
    train_counts = np.bincount(train_cube.labels.ravel(), minlength=len(classes))
    present = [k for k in range(1, len(classes)) if train_counts[k] > 0 and counts[k] > 0]
    rare = sorted(present, key=lambda k: train_counts[k])[:4]
    out: dict[str, Any] = {
        "classes": classes, "test_window_share": {classes[k]: float(share[k]) for k in range(len(classes))},
        "rarest_fault_share": float(min(share[k] for k in present)),
        "rare_classes": [classes[k] for k in rare],
        "test_windows_scored": sum(len(t) for t in tests), "test_runs": len(tests),
        "train_class_windows": {classes[k]: int(train_counts[k]) for k in range(len(classes))},
        "test_class_windows": {classes[k]: int(counts[k]) for k in range(len(classes))},
        "seeds": seeds, "runs": {}, "configs": {},
    }
    for seed in seeds:
        train = train_cube.window_set(SIM_HISTORY, normal_stride=SIM_TRAIN_STRIDE, seed=seed)
        val = val_cube.window_set(SIM_HISTORY, normal_stride=SIM_TRAIN_STRIDE, seed=seed)
        out["train_windows"] = len(train)
        for label, params in ABLATION.items():
            if configs is not None and label not in configs:
                continue
            console.log(f"simulated GPU faults, seed {seed}: {label}")
            det = TCEDetector(seed=seed, **{**SIM_TCE, **params})
            det.fit(train, validation=val, classes=classes, normal_subsample=SIM_TRAIN_STRIDE)
            out["runs"].setdefault(label, {})[str(seed)] = evaluate_sim(det, tests, classes, rare)
            out["configs"][label] = seed_summary(out["runs"][label])
            if measure_speed and "scoring" not in out:
                out["scoring"] = scoring_speed(det)
            if checkpoint is not None:
                checkpoint(out)
    return out


def seed_summary(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Mean and standard deviation over seeds of one ablation row."""
    row: dict[str, Any] = {"seeds": len(runs)}
    for metric in ("macro_f1", "rare_class_recall", "false_alarm_rate", "fit_seconds"):
        values = [r[metric] for r in runs.values()]
        row[metric], row[f"{metric}_std"] = float(np.mean(values)), float(np.std(values))
    row["per_class_recall"] = {c: float(np.mean([r["per_class"][c]["recall"] for r in runs.values()]))
                               for c in next(iter(runs.values()))["per_class"]}
    return row


def scoring_speed(detector: TCEDetector, n_gpus: int = 10_000) -> dict[str, float]:
    """Seconds to score one window per GPU for 10,000 GPUs (best of 3), TCE against the LSTM baseline."""
    from vigil.detect.learned.baselines import LSTMDetector

    rng = np.random.default_rng(0)
    n_features = len(detector.features_)
    windows = rng.normal(size=(n_gpus, detector.history, n_features)).astype(np.float32)
    context = rng.normal(size=(n_gpus, detector.n_context_)).astype(np.float32) if detector.n_context_ else None

    def best(fn: Any) -> float:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
        return min(times)

    tce_s = best(lambda: detector.predict_proba(windows, context))
    lstm = LSTMDetector(epochs=1).fit(windows[:2000, -30:, :])
    lstm_s = best(lambda: lstm.score(windows[:, -30:, :]))
    return {"gpus": n_gpus, "tce_s": tce_s, "lstm_s": lstm_s, "threads": torch.get_num_threads()}


def merge_asd_parts(result: dict[str, Any]) -> None:
    """Fold ASD folds run by side processes (``--folds``) into ``asd_protocol_b``."""
    extras = [k for k in result if k.startswith("asd_protocol_b_folds_") and not k.endswith("_seconds")]
    if not extras or "asd_protocol_b" not in result:
        return
    base = result["asd_protocol_b"]
    rows = list(base["results"])
    have = {(r["detector"], r["fold"], r["seed"]) for r in rows}
    timing = {k: [v] for k, v in base["fit_seconds"].items()}
    for key in extras:
        part = result.pop(key)
        result.pop(f"{key}_seconds", None)
        rows.extend(r for r in part["results"] if (r["detector"], r["fold"], r["seed"]) not in have)
        for name, seconds in part["fit_seconds"].items():
            timing.setdefault(name, []).append(seconds)
    result["asd_protocol_b"] = asd_summary(rows, timing, base["tce_loss_candidates"])


def merge_sim_parts(result: dict[str, Any]) -> None:
    """Fold ablation rows run by side processes (``--configs``) into ``sim_protocol_c``, in table order."""
    extras = [k for k in result if k.startswith("sim_protocol_c_rows_") and not k.endswith("_seconds")]
    if not extras or "sim_protocol_c" not in result:
        return
    configs = dict(result["sim_protocol_c"]["configs"])
    for key in extras:
        configs.update({k: v for k, v in result[key]["configs"].items() if k not in configs})
    result["sim_protocol_c"]["configs"] = {k: configs[k] for k in ABLATION if k in configs}


def print_tables(result: dict[str, Any]) -> None:
    asd = result["asd_protocol_b"]
    table = Table(title="ASD protocol (b): train on 4 entities, test on 4 unseen (both folds, mean of 8)")
    for col in ("detector", "F1 (point-wise)", "AUC-PR", "VUS-PR", "event recall", "delay", "F1 (PA)", "fit s"):
        table.add_column(col, justify="left" if col == "detector" else "right")
    for name, m in asd["summary"].items():
        table.add_row(name, f"{m['f1']:.3f}", f"{m['auc_pr']:.3f}", f"{m['vus_pr']:.3f}",
                      f"{m['event_recall']:.2f}", f"{m['delay']:.1f}", f"{m['f1_pa']:.3f}",
                      f"{asd['fit_seconds'].get(name, float('nan')):.1f}")
    for name, m in result.get("asd_ablation", {}).get("summary", {}).items():
        table.add_row(name, f"{m['f1']:.3f}", f"{m['auc_pr']:.3f}", f"{m['vus_pr']:.3f}",
                      f"{m['event_recall']:.2f}", f"{m['delay']:.1f}", f"{m['f1_pa']:.3f}", "-")
    console.print(table)
    sim = result["sim_protocol_c"]
    table = Table(title=f"simulated GPU faults, protocol (c): {len(sim['classes'])} classes, rarest fault "
                        f"{100 * sim['rarest_fault_share']:.3f} % of windows; mean ± std over seeds")
    for col in ("configuration", "seeds", "macro-F1", "rare-class recall", "false alarms / normal window", "fit s"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for label, m in sim["configs"].items():
        table.add_row(label, str(m["seeds"]), f"{m['macro_f1']:.3f} ± {m['macro_f1_std']:.3f}",
                      f"{m['rare_class_recall']:.3f} ± {m['rare_class_recall_std']:.3f}",
                      f"{m['false_alarm_rate']:.5f} ± {m['false_alarm_rate_std']:.5f}", f"{m['fit_seconds']:.0f}")
    console.print(table)
    speed = sim.get("scoring", {"gpus": 0, "tce_s": float("nan"), "lstm_s": float("nan"), "threads": 0})
    console.print(f"scoring {speed['gpus']:,} GPUs' windows: TCE {speed['tce_s']:.2f} s, "
                  f"LSTM baseline {speed['lstm_s']:.2f} s ({speed['threads']} threads)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds for the ASD part (every detector)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: quarter-size simulated data, 2 short epochs (numbers not comparable)")
    parser.add_argument("--only", choices=("asd", "sim", "asd-ablation"),
                        help="rerun one part, keep the others from the json")
    parser.add_argument("--folds", default="", help="ASD folds to run (0-based, comma-separated); their "
                        "results go to a separate part that the tables merge")
    parser.add_argument("--sim-seeds", default="0,1,2,3,4", help="training seeds for every simulated-GPU row")
    parser.add_argument("--configs", default="", help="sim ablation rows to run (1-based, comma-separated); "
                        "their results go to a separate part that the tables merge")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.quick:
        for params in (ASD_TCE, SIM_TCE):
            params.update(epochs=2, steps_per_epoch=10)
    started = time.perf_counter()
    out = OUT.with_name("detect-quick.json") if args.quick else OUT
    mine: dict[str, Any] = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
                            "threads": torch.get_num_threads()}
    result: dict[str, Any] = {}

    def save(part: str, value: dict[str, Any]) -> None:
        # Re-read before writing: `--only asd` and `--only sim` may run side by side.
        current = json.loads(out.read_text()) if args.only and out.exists() else {}
        mine[part] = value
        mine[f"{part}_seconds"] = time.perf_counter() - started
        current.update(mine)
        tmp = out.with_suffix(f".{part}.tmp")
        tmp.write_text(json.dumps(current, indent=1, default=float))
        tmp.replace(out)
        result.clear()
        result.update(current)

    out.parent.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "asd"):
        candidates = [{"weight_mode": "dynamic"}, {"weight_mode": "none"}]
        folds = [int(k) for k in args.folds.split(",") if k] or None
        asd_name = f"asd_protocol_b_folds_{args.folds.replace(',', '_')}" if folds else "asd_protocol_b"
        save(asd_name, asd_protocol_b(seeds, candidates, lambda part: save(asd_name, part), folds=folds))
    if args.only in (None, "asd-ablation"):
        save("asd_ablation", asd_ablation(seeds, lambda part: save("asd_ablation", part)))
    if args.only in (None, "sim"):
        labels = list(ABLATION)
        chosen = [labels[int(i) - 1] for i in args.configs.split(",") if i] or None
        name = f"sim_protocol_c_rows_{args.configs.replace(',', '_')}" if chosen else "sim_protocol_c"
        sim_seeds = [int(k) for k in args.sim_seeds.split(",") if k]
        save(name, sim_protocol_c(sim_seeds, args.quick, lambda part: save(name, part), configs=chosen,
                                  measure_speed=chosen is None))
    merge_sim_parts(result)
    merge_asd_parts(result)
    if "asd_protocol_b" not in result or "sim_protocol_c" not in result:
        console.print(f"wrote {out.relative_to(REPO)}; run the other part for the tables")
        return
    print_tables(result)
    console.print(f"wrote {out.relative_to(REPO)} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
