"""RL train / inference co-location: one RL step is a rollout (generation) then a training update; three ways to
place them on the same GPUs, simulated from a sample of generation lengths.

- separated: ``R`` GPUs only generate, the other ``N - R`` only train; the rollout GPUs wait while training runs
  and the training GPUs wait while rollout runs, then the new weights go over (``weight_sync_s``);
- co-located with switching: all ``N`` GPUs generate, switch to training (``switch_s``: the inference engine's
  memory released, the training state loaded), train, switch back;
- co-located with partial rollout: as co-located, but a step's rollout stops as soon as ``batch`` sequences have
  finished; the unfinished ones keep their tokens and continue in the next step, and the pool is topped up with
  new prompts to ``batch x (1 + over_provision)``. The long tail no longer holds every GPU; the price is that a
  long sequence spans several policy versions (reported as staleness).

Decoding model: a GPU turns out at most ``gpu_tokens_s`` tokens per second shared by its active sequences, and one
sequence at most ``seq_tokens_s`` (decoding one sequence is latency-bound), so a GPU left with few long sequences
is mostly idle - the tail effect. Training costs ``train_tokens_gpu_s`` tokens per GPU-second over the batch's
prompt and generated tokens. These rates are inputs (measure your model's); the lengths are data.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from vigil.model import VigilInputError

MODES = ("separated", "colocated", "partial")


@dataclass(frozen=True)
class RlCluster:
    gpus: int = 64
    batch: int = 8192                     # sequences trained on per step
    prompt_tokens: int = 512
    gpu_tokens_s: float = 2500.0          # decode throughput of one GPU, all its sequences together
    seq_tokens_s: float = 40.0            # decode speed of one sequence
    train_tokens_gpu_s: float = 1000.0    # training throughput per GPU (prompt + generated tokens)
    switch_s: float = 5.0                 # co-located: inference <-> training, each way (weights stay in memory)
    weight_sync_s: float = 5.0            # separated: new weights from the trainers to the generators
    block_gpus: int = 8                   # separated: GPUs move between the two roles a node at a time

    def __post_init__(self) -> None:
        if self.gpus < 2 * self.block_gpus or self.gpus % self.block_gpus:
            raise VigilInputError(f"gpus {self.gpus} must be a multiple of {self.block_gpus} and at least two nodes")
        if min(self.batch, self.gpu_tokens_s, self.seq_tokens_s, self.train_tokens_gpu_s) <= 0:
            raise VigilInputError("batch and throughputs must be positive")


@dataclass
class StepStats:
    mode: str
    rollout_gpus: int
    over_provision: float
    step_s: float
    rollout_s: float
    train_s: float
    overhead_s: float                     # switching or weight sync
    idle_fraction: float                  # GPU-seconds with no work / all GPU-seconds
    tail_s: float                         # rollout time after 90 % of the step's sequences had finished
    staleness: float                      # mean policy versions a trained sequence spans (1 = on-policy)
    samples_per_hour: float
    schedule: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Rollout:
    """One rollout phase's outcome on ``gpus`` GPUs."""

    duration_s: float
    busy_gpu_s: float
    finished: list[int]                   # indices into the pool of the sequences that finished
    tail_s: float


def _gpu_segments(tokens: np.ndarray, cluster: RlCluster) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One GPU decoding ``tokens`` (sorted ascending) to the end: all its active sequences share one speed, so
    they finish in order of length. Returns the end time of each segment (one per finished sequence), the
    tokens each active sequence has by then, and the GPU's busy fraction within each segment."""
    k = tokens.size
    active = k - np.arange(k)                     # sequences active in segment j
    speed = np.minimum(cluster.seq_tokens_s, cluster.gpu_tokens_s / active)
    done_tokens = tokens
    durations = np.diff(np.concatenate([[0.0], done_tokens])) / speed
    return np.cumsum(durations), done_tokens, active * speed / cluster.gpu_tokens_s


def _rollout(remaining: np.ndarray, gpus: int, cluster: RlCluster, stop_after: int) -> tuple[_Rollout, np.ndarray]:
    """Decode ``remaining`` tokens per sequence on ``gpus`` GPUs (sequences dealt round-robin) until
    ``stop_after`` sequences have finished; returns the phase and the tokens left per sequence."""
    owner = np.arange(remaining.size) % gpus
    per_gpu = []
    finish = np.empty(remaining.size)
    for gpu in range(gpus):
        mine = np.flatnonzero(owner == gpu)
        order = mine[np.argsort(remaining[mine], kind="stable")]
        ends, tokens, busy = _gpu_segments(remaining[order].astype(float), cluster)
        finish[order] = ends
        per_gpu.append((order, ends, tokens, busy))
    stop_after = min(stop_after, remaining.size)
    finished = np.argsort(finish, kind="stable")[:stop_after]
    stop = float(finish[finished[-1]]) if stop_after else 0.0
    left = np.zeros(remaining.size)
    busy_gpu_s = 0.0
    for order, ends, tokens, busy in per_gpu:
        if not order.size:
            continue
        starts = np.concatenate([[0.0], ends[:-1]])
        within = np.clip(np.minimum(ends, stop) - starts, 0.0, None)
        busy_gpu_s += float(np.sum(within * busy))
        # tokens every still-active sequence has at ``stop``: linear within the segment ``stop`` falls in
        j = int(np.searchsorted(ends, stop, side="left"))
        if j < order.size:
            before = tokens[j - 1] if j else 0.0
            reached = before + (tokens[j] - before) * (stop - starts[j]) / max(ends[j] - starts[j], 1e-12)
            left[order[j:]] = remaining[order[j:]] - reached
    left[finished] = 0.0
    left = np.maximum(left, 0.0)
    times = np.sort(finish[finished])
    tail = stop - float(times[math.ceil(0.9 * times.size) - 1]) if times.size else 0.0
    return _Rollout(stop, busy_gpu_s, [int(i) for i in finished], tail), left


def _train_s(tokens: float, gpus: int, cluster: RlCluster) -> float:
    return tokens / (cluster.train_tokens_gpu_s * gpus)


def simulate(lengths: np.ndarray, cluster: RlCluster, mode: str, *, rollout_gpus: int | None = None,
             over_provision: float = 0.5, steps: int = 20, seed: int = 0) -> StepStats:
    """Mean step of ``steps`` RL steps (after one warm-up step) with generation lengths drawn from ``lengths``."""
    if mode not in MODES:
        raise VigilInputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if lengths.size == 0 or np.any(lengths <= 0):
        raise VigilInputError("generation lengths must be a non-empty sample of positive token counts")
    b, n = cluster.batch, cluster.gpus
    if rollout_gpus is not None and not 0 < rollout_gpus < n:
        raise VigilInputError(f"rollout GPUs must be between 1 and {n - 1}, got {rollout_gpus}")
    rng = np.random.default_rng(seed)
    totals: dict[str, float] = {"step": 0.0, "rollout": 0.0, "train": 0.0, "overhead": 0.0, "idle": 0.0,
                                "tail": 0.0, "stale": 0.0}
    pool, full = np.zeros(0), np.zeros(0)
    born = np.zeros(0, dtype=int)
    for step in range(steps + 1):
        if mode == "partial":
            size = math.ceil(b * (1.0 + over_provision))
            fresh = rng.choice(lengths, size - pool.size).astype(float)
            pool, full = np.concatenate([pool, fresh]), np.concatenate([full, fresh])
            born = np.concatenate([born, np.full(fresh.size, step)])
        else:
            pool = rng.choice(lengths, b).astype(float)
            full, born = pool.copy(), np.full(b, step)
        gen_gpus = n if mode != "separated" else int(rollout_gpus or n // 2)
        phase, left = _rollout(pool, gen_gpus, cluster, stop_after=b)
        done = np.array(phase.finished, dtype=int)
        # tokens trained on: the finished sequences' prompts and whole generations (partly from earlier steps)
        train_tokens = float(done.size * cluster.prompt_tokens + np.sum(full[done]))
        train_gpus = n - gen_gpus if mode == "separated" else n
        train = _train_s(train_tokens, train_gpus, cluster)
        if mode == "separated":
            overhead = cluster.weight_sync_s
            step_s = phase.duration_s + overhead + train
            busy = phase.busy_gpu_s + train * train_gpus
        else:
            overhead = 2 * cluster.switch_s
            step_s = phase.duration_s + overhead + train
            busy = phase.busy_gpu_s + train * n
        stale = float(np.mean(step - born[done] + 1)) if done.size else 1.0
        keep = np.setdiff1d(np.arange(pool.size), done)
        pool, full, born = left[keep], full[keep], born[keep]
        if step == 0:
            continue  # warm-up: partial rollout's pool fills in its first step
        for key, value in (("step", step_s), ("rollout", phase.duration_s), ("train", train),
                           ("overhead", overhead), ("idle", n * step_s - busy), ("tail", phase.tail_s),
                           ("stale", stale)):
            totals[key] += value
    mean = {key: value / steps for key, value in totals.items()}
    gen_gpus = n if mode != "separated" else int(rollout_gpus or n // 2)
    schedule = _schedule(mode, gen_gpus, n, mean)
    return StepStats(mode, gen_gpus, over_provision if mode == "partial" else 0.0, mean["step"], mean["rollout"],
                     mean["train"], mean["overhead"], mean["idle"] / (n * mean["step"]), mean["tail"],
                     mean["stale"], 3600.0 * b / mean["step"], schedule)


def _schedule(mode: str, gen_gpus: int, n: int, mean: dict[str, float]) -> list[dict[str, Any]]:
    """One step's phases with their GPUs, as the actuators bound them (a tier quota per phase)."""
    if mode == "separated":
        return [
            {"phase": "rollout", "gpus": gen_gpus, "duration_s": mean["rollout"]},
            {"phase": "weight_sync", "gpus": n, "duration_s": mean["overhead"]},
            {"phase": "train", "gpus": n - gen_gpus, "duration_s": mean["train"]},
        ]
    return [
        {"phase": "rollout", "gpus": n, "duration_s": mean["rollout"]},
        {"phase": "switch", "gpus": n, "duration_s": mean["overhead"] / 2},
        {"phase": "train", "gpus": n, "duration_s": mean["train"]},
        {"phase": "switch", "gpus": n, "duration_s": mean["overhead"] / 2},
    ]


def best_separated(lengths: np.ndarray, cluster: RlCluster, steps: int = 10, seed: int = 0) -> StepStats:
    """The separated deployment with the rollout / training split (whole nodes) of the shortest step."""
    splits = range(cluster.block_gpus, cluster.gpus, cluster.block_gpus)
    return min((simulate(lengths, cluster, "separated", rollout_gpus=r, steps=steps, seed=seed) for r in splits),
               key=lambda s: s.step_s)


OVER_PROVISION = (0.1, 0.25, 0.5, 1.0)


def best_partial(lengths: np.ndarray, cluster: RlCluster, choices: tuple[float, ...] = OVER_PROVISION,
                 steps: int = 10, seed: int = 0) -> StepStats:
    """Partial rollout with the over-provisioning of the shortest step."""
    return min((simulate(lengths, cluster, "partial", over_provision=o, steps=steps, seed=seed) for o in choices),
               key=lambda s: s.step_s)


@dataclass
class RlPlan:
    """The three deployments on one cluster and the chosen one (the most samples per hour)."""

    cluster: RlCluster
    separated: StepStats
    colocated: StepStats
    partial: StepStats

    @property
    def chosen(self) -> StepStats:
        return max((self.separated, self.colocated, self.partial), key=lambda s: s.samples_per_hour)

    def quotas(self) -> dict[str, int]:
        """GPUs per RL queue for the chosen plan: rollout and training queues when separated, one otherwise."""
        chosen = self.chosen
        if chosen.mode == "separated":
            return {"rl-rollout": chosen.rollout_gpus, "rl-train": self.cluster.gpus - chosen.rollout_gpus}
        return {"rl-colocated": self.cluster.gpus}

    def as_dict(self) -> dict[str, Any]:
        return {"cluster": asdict(self.cluster), "chosen": self.chosen.mode, "quotas": self.quotas(),
                "plans": {s.mode: s.as_dict() for s in (self.separated, self.colocated, self.partial)}}


def plan_rl(lengths: np.ndarray, cluster: RlCluster, *, over_provision: float | None = None,
            rollout_gpus: int | None = None, steps: int = 10, seed: int = 0) -> RlPlan:
    """Simulate the three deployments; the separated split and the over-provisioning are searched unless given
    (choose them on development data, then pass them in for reported data)."""
    separated = (simulate(lengths, cluster, "separated", rollout_gpus=rollout_gpus, steps=steps, seed=seed)
                 if rollout_gpus else best_separated(lengths, cluster, steps, seed))
    partial = (simulate(lengths, cluster, "partial", over_provision=over_provision, steps=steps, seed=seed)
               if over_provision is not None else best_partial(lengths, cluster, steps=steps, seed=seed))
    return RlPlan(cluster, separated, simulate(lengths, cluster, "colocated", steps=steps, seed=seed), partial)
