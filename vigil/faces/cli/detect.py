"""``vigil detect``: train the TCE model and evaluate every detector on labelled data."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from vigil.faces.cli.output import DataTable, SafeConsole, styled
from vigil.model import VigilInputError

app = typer.Typer(help="Learned anomaly detection: train TCE, evaluate detectors honestly.", no_args_is_help=True)
console = SafeConsole()

FORMAT_HELP = "data format: asd, nab, csv (docs/detection.md) or sim (a `vigil sim --out` directory)"


def _names(text: str | None) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()] if text else []


def _progress() -> Any:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=SafeConsole(stderr=True), transient=True)


def _split_entities(dataset: Any, train: list[str], test: list[str]) -> tuple[list[str], list[str]]:
    names = list(dataset.entities)
    if train and not test:
        test = [n for n in names if n not in train]
    elif test and not train:
        train = [n for n in names if n not in test]
    return train, test


@app.command("train")
def train_command(
    data: Annotated[Path, typer.Option("--data", help="data directory")],
    fmt: Annotated[str, typer.Option("--format", help=FORMAT_HELP)],
    out: Annotated[Path, typer.Option("--out", help="directory to save the model to")] = Path(".vigil/models/tce"),
    train_entities: Annotated[str, typer.Option("--train-entities", help="comma-separated; default: all")] = "",
    epochs: Annotated[int, typer.Option(help="maximum epochs (early stopping on validation data)")] = 10,
    history: Annotated[int, typer.Option(help="rows of history per window (the recent window is the last 30)")] = 288,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    members: Annotated[int, typer.Option(help="ensemble size: members trained from different seeds, logits "
                                         "averaged")] = 1,
    calibrate: Annotated[bool, typer.Option(help="hold the last entity's labelled data out of training to "
                                            "calibrate the novelty weight (needs 2+ entities)")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print the training report as JSON")] = False,
) -> None:
    """Train TCE on labelled entities (validation = the newest 30 % of their labelled data) and save it."""
    import torch

    from vigil.detect.learned.tce import TCEDetector, save_detector
    from vigil_eval.detection import calibration_split, fleet_split
    from vigil_eval.formats import load

    torch.set_num_threads(max(1, torch.get_num_threads()))
    dataset = load(fmt, data)
    names = _names(train_entities) or list(dataset.entities)
    if calibrate:
        train, val, calibration = calibration_split(dataset, names, history=history)
    else:
        (train, val, _), calibration = fleet_split(dataset, names, [], history=history), None
    if not (train.labels > 0).any():
        raise VigilInputError(f"{data}: the training entities hold no labelled anomaly; TCE is supervised")
    detector = TCEDetector(history=history, epochs=epochs, seed=seed, members=members,
                           recent=min(30, history), scales=tuple(s for s in (12, 48) if s < history))
    with _progress() as progress:
        task = progress.add_task("training TCE", total=epochs * members)
        detector.fit(train, validation=val, classes=dataset.classes, features=dataset.features,
                     calibration=calibration,
                     progress=lambda epoch, total, loss: progress.advance(task))
    save_detector(detector, out)
    report = {"model": str(out), "entities": names, "classes": detector.classes_,
              "epochs_run": detector.report_.epochs_run, "best_epoch": detector.report_.best_epoch,
              detector.report_.validation_metric or "validation": detector.report_.best_validation,
              "novelty_weight": detector.novelty_weight_, "seconds": round(detector.report_.seconds, 1)}
    if as_json:
        print(json.dumps(report))
    else:
        brief = {k: v for k, v in report.items() if k not in ("model", "entities", "classes")}
        console.print(f"saved TCE to [bold]{escape(str(out))}[/] ({len(names)} entities, "
                      f"{len(detector.classes_)} classes): {escape(str(brief))}")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.3f}"
    return str(value)


@app.command("eval")
def eval_command(
    data: Annotated[Path, typer.Option("--data", help="data directory")],
    fmt: Annotated[str, typer.Option("--format", help=FORMAT_HELP)],
    train_entities: Annotated[str, typer.Option("--train-entities",
                                                help="protocol (b): train on these entities")] = "",
    test_entities: Annotated[str, typer.Option("--test-entities",
                                               help="protocol (b): test on these (unseen) ones")] = "",
    detectors: Annotated[str, typer.Option("--detectors", help="comma-separated; default: all "
                                           "(tce,lstm,pca,iforest,kmeans,random)")] = "",
    history: Annotated[int, typer.Option(help="rows of history per window")] = 288,
    epochs: Annotated[int, typer.Option(help="TCE: maximum epochs")] = 8,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Score detectors per entity: F1 at a validation-chosen threshold, AUC-PR, VUS-PR, event recall, delay,
    and point-adjusted F1 (a separate, inflated column). Without entity lists: protocol (a), per entity."""
    import torch

    from vigil_eval.detection import DETECTORS, calibration_split, entity_split, fleet_split, run_detector, summarise
    from vigil_eval.formats import load

    torch.set_num_threads(max(1, torch.get_num_threads()))
    names = _names(detectors) or list(DETECTORS)
    unknown = [n for n in names if n not in DETECTORS]
    if unknown:
        raise VigilInputError(f"unknown detector {unknown[0]!r}: expected some of {', '.join(DETECTORS)}")
    dataset = load(fmt, data)
    train, test = _split_entities(dataset, _names(train_entities), _names(test_entities))
    tce_params = {"history": history, "recent": min(30, history), "epochs": epochs,
                  "scales": tuple(s for s in (12, 48) if s < history)}
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    tce_split = None
    with _progress() as progress:
        if train:
            protocol = "b: fleet model, unseen test entities"
            splits = [fleet_split(dataset, train, test, history=history)]
            if "tce" in names:
                tce_split = calibration_split(dataset, train, history=history)
        else:
            protocol = "a: per entity, threshold on the oldest 30 % of its labelled data"
            splits = []
            for series in dataset.entities.values():
                tr, va, te = entity_split(series, history=history)
                splits.append((tr, va, {series.entity: te}))
        task = progress.add_task("evaluating", total=len(names) * len(splits))
        for name in names:
            for tr, va, tests in splits:
                if name == "tce" and not (tr.labels > 0).any():
                    notes.append(f"tce skipped for {', '.join(tests)}: no labelled anomaly to train on")
                elif len(tr) == 0:
                    notes.append(f"{name} skipped for {', '.join(tests)}: no training data")
                else:
                    result, _ = run_detector(name, tr, va, tests, seed=seed, classes=dataset.classes,
                                             tce_params=tce_params, tce_split=tce_split)
                    rows.extend(result)
                progress.advance(task)
    summary = summarise(rows) if rows else {}
    if as_json:
        print(json.dumps({"protocol": protocol, "results": rows, "summary": summary, "notes": notes},
                         default=lambda v: None))
        return
    table = DataTable(title=f"vigil detect eval - {dataset.name}, protocol {protocol}")
    columns = ["detector", "entity", "f1", "auc_pr", "vus_pr", "event_recall", "delay", "f1_pa"]
    for col in columns:
        table.add_column("F1 (point-adjusted)" if col == "f1_pa" else col, justify="left" if col in
                         ("detector", "entity") else "right")
    for row in rows:
        table.add_row(*[_fmt(row[c]) for c in columns])
    for name, means in summary.items():
        table.add_row(styled(name, "bold"), styled("mean", "bold"), *[_fmt(means[c]) for c in columns[2:]])
    console.print(table)
    for note in notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
