"""RL train / inference co-location: separated deployment vs co-located with switching vs co-located with
partial rollout, one RL step simulated on 64 GPUs with generation lengths from the real Azure LLM inference
trace (2023, conversation: GeneratedTokens per request).

Run: .venv/bin/python bench/rl.py -> bench/results/rl.json

Lengths (real): the trace's requests in time order; the first half is the development fold, the second half
the reported fold. On the development fold the planner chooses the separated deployment's split (generating vs
training GPUs, whole 8-GPU nodes) and partial rollout's over-provisioning (of 0.1, 0.25, 0.5, 1.0), each the
one with the shortest step; the reported fold is run with those choices fixed.

Rates (inputs, not measured here; `vigil tide rl` takes yours): a GPU decodes 2,500 tokens/s over its
sequences, one sequence at most 40 tokens/s; training 1,000 tokens/s per GPU over prompt (512) and generated
tokens; co-located switch 5 s each way; separated weight sync 5 s; 8,192 sequences trained per step.

Measures per step (mean of 20 steps after a warm-up): step time, GPU idle share (GPU-seconds with no decoding
or training / all GPU-seconds), tail (rollout time after 90 % of the step's sequences finished), staleness
(policy versions a trained sequence spans), samples per hour.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from vigil.remedy.tide.load import read_generation_lengths
from vigil.remedy.tide.rl import RlCluster, StepStats, best_partial, best_separated, plan_rl

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "rl.json"
TRACE = REPO.parent / "shared" / "data" / "azure_llm_inference_2023" / "AzureLLMInferenceTrace_conv.csv"
STEPS = 20
console = Console(width=150)


def row(stats: StepStats) -> dict[str, float | int | str]:
    return {key: value for key, value in stats.as_dict().items() if key != "schedule"}


def main() -> None:
    lengths = read_generation_lengths(TRACE)
    dev, held_out = lengths[: lengths.size // 2], lengths[lengths.size // 2:]
    cluster = RlCluster()
    split = best_separated(dev, cluster, steps=STEPS).rollout_gpus
    over = best_partial(dev, cluster, steps=STEPS).over_provision
    plan = plan_rl(held_out, cluster, rollout_gpus=split, over_provision=over, steps=STEPS, seed=1)
    runs = [plan.separated, plan.colocated, plan.partial]
    table = Table(title=f"RL step, {cluster.gpus} GPUs, {cluster.batch} sequences/step, held-out lengths "
                        f"(median {np.median(held_out):.0f}, p99 {np.percentile(held_out, 99):.0f} tokens)")
    for column in ("deployment", "step s", "rollout s", "train s", "switch/sync s", "GPU idle", "tail s",
                   "staleness", "samples/h", "vs separated"):
        table.add_column(column, justify="right")
    for stats in runs:
        table.add_row(stats.mode, f"{stats.step_s:.1f}", f"{stats.rollout_s:.1f}", f"{stats.train_s:.1f}",
                      f"{stats.overhead_s:.1f}", f"{stats.idle_fraction:.1%}", f"{stats.tail_s:.1f}",
                      f"{stats.staleness:.2f}", f"{stats.samples_per_hour:,.0f}",
                      f"{stats.samples_per_hour / plan.separated.samples_per_hour:.2f}x")
    console.print(table)
    console.print(f"chosen on development lengths: separated split {split} generating GPUs, partial rollout "
                  f"over-provisioning {over:.0%}; the planner's pick: {plan.chosen.mode}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "machine": platform.platform(),
        "trace": TRACE.name,
        "lengths": {"development": int(dev.size), "reported": int(held_out.size),
                    "reported_median": float(np.median(held_out)),
                    "reported_p99": float(np.percentile(held_out, 99))},
        "chosen_on_development": {"separated_rollout_gpus": split, "partial_over_provision": over},
        "cluster": plan.as_dict()["cluster"],
        "runs": [row(stats) for stats in runs],
        "chosen": plan.chosen.mode,
        "schedule": plan.chosen.schedule,
        "quotas": plan.quotas(),
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
