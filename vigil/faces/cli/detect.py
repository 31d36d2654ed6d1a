"""``vigil detect``: train the TCE model and evaluate every detector on labelled data."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from vigil.config import settings
from vigil.faces.cli.output import DataTable, ProgressBar, SafeConsole, json_text, styled
from vigil.model import VigilInputError

app = typer.Typer(help="Learned anomaly detection: train TCE, evaluate detectors honestly.", no_args_is_help=True)
console = SafeConsole()

FORMAT_HELP = "data format: asd, nab, csv (docs/detection.md) or sim (a `vigil sim --out` directory)"


def _names(text: str | None) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()] if text else []


def _progress() -> Any:
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    return ProgressBar(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
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
    out: Annotated[Path | None, typer.Option("--out", help="directory to save the model to (default: "
                                             "<home>/models/tce, home from VIGIL_HOME or ./.vigil)")] = None,
    train_entities: Annotated[str, typer.Option("--train-entities", help="comma-separated; default: all")] = "",
    epochs: Annotated[int | None, typer.Option(help="maximum epochs (early stopping on held-out data); default "
                                               "5 on server data, as the benchmark, 10 on simulated runs")] = None,
    history: Annotated[int, typer.Option(help="rows of history per window (the benchmark reads 96 rows of server "
                                         "data)")] = 288,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    members: Annotated[int, typer.Option(help="ensemble size: members trained from different seeds, logits "
                                         "averaged")] = 1,
    inner_folds: Annotated[int, typer.Option("--inner-folds", help="server data: groups of training entities "
                                             "that take turns as the held-out ones when the input scaling, score "
                                             "mix, smoothing, epochs and threshold are chosen")] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="print the training report as JSON")] = False,
) -> None:
    """Train TCE on labelled entities and save it.

    Server data (asd, nab, csv): every choice is made as the benchmark makes it, on inner folds of the
    training entities (fit on some, score the others against their own history); the winner is refitted on
    all of them. Simulated GPU runs (sim, per-window context): the classifier alone, validation = the newest
    30 % of the labelled data."""
    import torch

    from vigil.detect.learned.tce import save_detector
    from vigil_eval.detection import (
        SERVER_TCE,
        candidates_for,
        choose_on_inner_folds,
        fit_chosen,
        fleet_split,
        make_detector,
        scaled_inputs,
    )
    from vigil_eval.formats import load

    torch.set_num_threads(max(1, torch.get_num_threads()))
    out = out or settings().home / "models" / "tce"
    dataset = load(fmt, data)
    names = _names(train_entities) or list(dataset.entities)
    series = dataset.select(names)
    if not any((s.test_labels > 0).any() or (s.train_labels is not None and (s.train_labels > 0).any())
               for s in series):
        raise VigilInputError(f"{data}: the training entities hold no labelled anomaly; TCE is supervised")
    server = all(s.train is not None and s.test_context is None for s in series)
    params: dict[str, Any] = ({**SERVER_TCE, "recent": min(SERVER_TCE["recent"], history)} if server else
                              {"recent": min(30, history), "scales": (12, 48), "epochs": 10})
    params.update(history=history, members=members, scales=tuple(s for s in params["scales"] if s < history))
    if epochs is not None:
        params["epochs"] = epochs
    with _progress() as progress:
        if server:
            if len(names) < max(inner_folds, 2):
                raise VigilInputError(f"{data}: {len(names)} training entities; the inner-fold choice needs at "
                                      f"least {max(inner_folds, 2)} (one per inner fold)")
            candidates = candidates_for("tce", params)
            task = progress.add_task("choosing on inner folds", total=inner_folds * len(candidates) + 1)
            scaled = scaled_inputs(dataset)
            choice = choose_on_inner_folds(scaled, candidates, names, inner=inner_folds, history=history, seed=seed,
                                           log=lambda msg: progress.advance(task))
            detector = fit_chosen(scaled, candidates, choice, names, history=history, seed=seed)
            progress.advance(task)
        else:
            train, val, _ = fleet_split(dataset, names, [], history=history)
            detector = make_detector("tce", seed, **params)
            task = progress.add_task("training TCE", total=params["epochs"] * members)
            detector.fit(train, validation=val, classes=dataset.classes, features=dataset.features,
                         progress=lambda epoch, total, loss: progress.advance(task))
    save_detector(detector, out)
    report = {"model": str(out), "entities": names, "classes": detector.classes_,
              "epochs_run": detector.report_.epochs_run, "best_epoch": detector.report_.best_epoch,
              "choice": getattr(detector, "choice_", None), "mix": list(detector.mix), "smooth": detector.smooth,
              "combine": detector.combine,
              "seconds": round(detector.report_.seconds, 1)}
    if as_json:
        print(json_text(report))
    else:
        choice = report["choice"]
        said = (f"chosen on inner folds: {choice['scaling']} scaling, {choice['variant']}, {choice['epochs']} "
                f"epochs, inner AUC-PR {choice['inner_auc_pr']:.3f}" if choice else "classifier alone")
        console.print(f"saved TCE to [bold]{escape(str(out))}[/] ({len(names)} entities, "
                      f"{len(detector.classes_)} classes; {escape(said)})")


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

    from vigil_eval.detection import DETECTORS, entity_split, fleet_split, run_detector, summarise
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
    with _progress() as progress:
        if train:
            protocol = "b: fleet model, unseen test entities"
            splits = [fleet_split(dataset, train, test, history=history)]
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
                                             tce_params=tce_params)
                    rows.extend(result)
                progress.advance(task)
    summary = summarise(rows) if rows else {}
    if as_json:
        print(json_text({"protocol": protocol, "results": rows, "summary": summary, "notes": notes},
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
