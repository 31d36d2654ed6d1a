"""Benchmark the learned detectors: ASD protocol (b), simulated GPU faults protocol (c) with the ablation,
training time and scoring speed. Writes bench/results/detect.json.

    .venv/bin/python bench/detect.py [--seeds 0,1] [--quick]

Every number comes from this run; baselines run on the same splits with the same threshold rule (best F1 on
validation data only), so the ratios are what to compare on a shared, noisy machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from vigil.detect.datasets import load_asd
from vigil.detect.evaluate import DETECTORS, class_report, fleet_split, run_detector, summarise
from vigil.detect.simdata import GpuCube, gpu_cube, gpu_fault_classes
from vigil.detect.tce import TCEDetector
from vigil.sim.generator import SimConfig, simulate

REPO = Path(__file__).resolve().parents[1]
ASD = REPO.parent / "shared" / "data" / "asd"
OUT = REPO / "bench" / "results" / "detect.json"
console = Console()

ASD_FOLDS = ((["omi-1", "omi-2", "omi-3", "omi-4"], ["omi-5", "omi-6", "omi-7", "omi-8"]),
             (["omi-5", "omi-6", "omi-7", "omi-8"], ["omi-1", "omi-2", "omi-3", "omi-4"]))
ASD_TCE = {"history": 288, "recent": 30, "scales": (12, 48), "epochs": 8, "steps_per_epoch": 100}
SIM_HISTORY = 120
SIM_TCE = {"history": SIM_HISTORY, "recent": 20, "scales": (10, 40), "epochs": 8, "steps_per_epoch": 100,
           "patience": 3}
SIM_TRAIN_STRIDE = 20
SIM_TEST_STRIDE = 10
ABLATION: dict[str, dict[str, Any]] = {
    "TCE (dynamic weights, all parts)": {},
    "plain cross-entropy": {"weight_mode": "none"},
    "static effective-number weights": {"weight_mode": "static"},
    "no long-history branch": {"use_history": False},
    "no context features": {"use_context": False},
    "no normal-context memory": {"prototypes": 0},
}


def tce_selected_on_validation(train: Any, val: Any, tests: dict[str, Any], seed: int, classes: list[str],
                               candidates: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float]:
    """Train one TCE per loss candidate and keep the one with the best validation AUC-PR: the choice of the
    loss is a hyper-parameter, so it is made on validation data, never on the test entities. Every
    candidate's rows are kept under ``tce[<mode>]`` for the record; the selected one is ``tce``."""
    best: tuple[float, list[dict[str, Any]]] | None = None
    rows: list[dict[str, Any]] = []
    fit_s = 0.0
    for params in candidates:
        result, times = run_detector("tce", train, val, tests, seed=seed, classes=classes,
                                     tce_params={**ASD_TCE, **params})
        fit_s += times["fit_s"]
        tag = f"tce[{params.get('weight_mode', 'dynamic')}]"
        rows.extend({**r, "detector": tag, "validation_auc_pr": times["validation"]} for r in result)
        if best is None or times["validation"] > best[0]:
            best = (times["validation"], result)
    assert best is not None
    return rows + [{**r, "selected_by_validation": True} for r in best[1]], fit_s


def asd_protocol_b(seeds: list[int], candidates: list[dict[str, Any]],
                   checkpoint: Any = None, folds: list[int] | None = None) -> dict[str, Any]:
    """Seeds outermost, so a run cut short still holds complete seeds; ``checkpoint(partial)`` after each
    detector saves what is done."""
    dataset = load_asd(ASD)
    rows: list[dict[str, Any]] = []
    timing: dict[str, list[float]] = {}
    chosen = folds if folds is not None else list(range(len(ASD_FOLDS)))
    splits = {k: fleet_split(dataset, *ASD_FOLDS[k], history=ASD_TCE["history"]) for k in chosen}
    part: dict[str, Any] = {}
    for seed in seeds:
        for fold, (train, val, tests) in splits.items():
            for name in DETECTORS:
                if seed != seeds[0] and name not in ("tce", "lstm"):
                    continue
                console.log(f"ASD seed {seed} fold {fold}: {name}")
                if name == "tce":
                    result, fit_s = tce_selected_on_validation(train, val, tests, seed, dataset.classes, candidates)
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


def asd_summary(rows: list[dict[str, Any]], timing: dict[str, list[float]],
                candidates: list[dict[str, Any]]) -> dict[str, Any]:
    per_seed = {}
    for seed in sorted({r["seed"] for r in rows}):
        mine = [r for r in rows if r["detector"] == "tce" and r["seed"] == seed]
        per_seed[seed] = summarise(mine).get("tce", {}) if mine else {}
    return {"results": rows, "summary": summarise(rows), "tce_per_seed": per_seed,
            "seeds_done": sorted({r["seed"] for r in rows if r["detector"] == "tce"}),
            "fit_seconds": {k: float(np.mean(v)) for k, v in timing.items()},
            "tce_loss_candidates": candidates}


def sim_cube(seed: int, nodes: int, minutes: float) -> GpuCube:
    gpu_types = tuple(gpu_fault_classes()[1:])
    run = simulate(SimConfig(nodes=nodes, gpus=8, minutes=minutes, seed=seed, interval_s=30.0,
                             faults_per_node_hour=1.0, fault_types=gpu_types))
    return gpu_cube((f for tick in run.ticks() for f in tick.frames), run.events, run.ground_truth,
                    run.topology, gpu_fault_classes())


def sim_protocol_c(seed: int, quick: bool, checkpoint: Any = None, configs: list[str] | None = None,
                   measure_speed: bool = True) -> dict[str, Any]:
    classes = gpu_fault_classes()
    scale = 0.25 if quick else 1.0
    train_cube = sim_cube(101, int(32 * scale), 480)
    val_cube = sim_cube(202, int(16 * scale), 240)
    test_cube = sim_cube(303, int(32 * scale), 480)
    train = train_cube.window_set(SIM_HISTORY, normal_stride=SIM_TRAIN_STRIDE, seed=seed)
    val = val_cube.window_set(SIM_HISTORY, normal_stride=SIM_TRAIN_STRIDE, seed=seed)
    test = test_cube.window_set(SIM_HISTORY, normal_stride=SIM_TEST_STRIDE, seed=seed)
    weights = np.where(test.labels == 0, float(SIM_TEST_STRIDE), 1.0)
    counts = np.bincount(test_cube.labels.ravel(), minlength=len(classes))
    share = counts / counts.sum()
    train_counts = np.bincount(train_cube.labels.ravel(), minlength=len(classes))
    present = [k for k in range(1, len(classes)) if train_counts[k] > 0 and counts[k] > 0]
    rare = sorted(present, key=lambda k: train_counts[k])[:4]
    out: dict[str, Any] = {
        "classes": classes, "test_window_share": {classes[k]: float(share[k]) for k in range(len(classes))},
        "rarest_fault_share": float(min(share[k] for k in present)),
        "rare_classes": [classes[k] for k in rare], "train_windows": len(train), "test_windows_scored": len(test),
        "configs": {},
    }
    detector: TCEDetector | None = None
    for label, params in ABLATION.items():
        if configs is not None and label not in configs:
            continue
        if measure_speed and detector is not None and "scoring" not in out:
            out["scoring"] = scoring_speed(detector)
        console.log(f"simulated GPU faults: {label}")
        det = TCEDetector(seed=seed, **{**SIM_TCE, **params})
        det.fit(train, validation=val, classes=classes, normal_subsample=SIM_TRAIN_STRIDE)
        report = class_report(test.labels, det.predict_class(test), classes, sample_weight=weights)
        report["rare_class_recall"] = float(np.mean([report["per_class"][classes[k]]["recall"] for k in rare]))
        report["fit_seconds"] = det.report_.seconds
        report["epochs_run"] = det.report_.epochs_run
        out["configs"][label] = report
        detector = detector or det
        if checkpoint is not None:
            checkpoint(out)
    return out


def scoring_speed(detector: TCEDetector, n_gpus: int = 10_000) -> dict[str, float]:
    """Seconds to score one window per GPU for 10,000 GPUs (best of 3), TCE against the LSTM baseline."""
    from vigil.detect.baselines import LSTMDetector

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
    console.print(table)
    sim = result["sim_protocol_c"]
    table = Table(title=f"simulated GPU faults, protocol (c): {len(sim['classes'])} classes, rarest fault "
                        f"{100 * sim['rarest_fault_share']:.2f} % of windows")
    for col in ("configuration", "macro-F1", "rare-class recall", "fit s"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for label, rep in sim["configs"].items():
        table.add_row(label, f"{rep['macro_f1']:.3f}", f"{rep['rare_class_recall']:.3f}", f"{rep['fit_seconds']:.0f}")
    console.print(table)
    speed = sim.get("scoring", {"gpus": 0, "tce_s": float("nan"), "lstm_s": float("nan"), "threads": 0})
    console.print(f"scoring {speed['gpus']:,} GPUs' windows: TCE {speed['tce_s']:.2f} s, "
                  f"LSTM baseline {speed['lstm_s']:.2f} s ({speed['threads']} threads)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0", help="comma-separated seeds for TCE and the LSTM")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: quarter-size simulated data, 2 short epochs (numbers not comparable)")
    parser.add_argument("--only", choices=("asd", "sim"), help="rerun one part, keep the other from the json")
    parser.add_argument("--folds", default="", help="ASD folds to run (0-based, comma-separated); their "
                        "results go to a separate part that the tables merge")
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
    if args.only in (None, "sim"):
        labels = list(ABLATION)
        chosen = [labels[int(i) - 1] for i in args.configs.split(",") if i] or None
        name = f"sim_protocol_c_rows_{args.configs.replace(',', '_')}" if chosen else "sim_protocol_c"
        save(name, sim_protocol_c(seeds[0], args.quick, lambda part: save(name, part), configs=chosen,
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
