"""Write a simulated run as plain files other tools can read, and read it back.

Layout of ``vigil sim --out DIR``::

    DIR/topology.json              the Topology record
    DIR/ground_truth.jsonl         one GroundTruthFault per line
    DIR/events.jsonl               one Event per line (IPMI, job)
    DIR/logs/kernel/<node>.log     dmesg-style kernel lines (NVRM Xid, mlx5, mce, EXT4)
    DIR/logs/kubernetes/<node>.log Kubernetes Event objects about the node, one API JSON object per line
    DIR/logs/ranks/<job>/rank-<r>.log   each rank's log lines (NCCL / CUDA / Python errors)
    DIR/metrics/<family>.npz       ts[T], entities[E], metrics[M], values[T, E, M] (float32, NaN = missing)
    DIR/config.json                the SimConfig that produced it
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vigil.model import Event, GroundTruthFault, LogRecord, Topology, VigilInputError, parse_entity
from vigil.sources.sim.generator import SimRun
from vigil.store.metrics import MetricFrame


def write_sim(run: SimRun, out: Path, progress: Callable[[int, int], None] | None = None) -> dict[str, int]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "topology.json").write_text(run.topology.model_dump_json(indent=1))
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(run.config), default=list, indent=1))
    (out / "ground_truth.jsonl").write_text("".join(g.model_dump_json() + "\n" for g in run.ground_truth))
    (out / "events.jsonl").write_text("".join(e.model_dump_json() + "\n" for e in run.events))
    by_file: dict[Path, list[str]] = {}
    for record in [*run.logs, *run.kube_events]:
        kind, parts = parse_entity(record.entity)
        path = (out / "logs" / record.source / f"{parts[0]}.log" if kind == "node"
                else out / "logs" / "ranks" / parts[0] / f"rank-{int(parts[1]):05d}.log")
        by_file.setdefault(path, []).append(record.line)
    for path, lines in by_file.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    families: dict[str, tuple[list[float], list[np.ndarray], MetricFrame]] = {}
    for k, tick in enumerate(run.ticks()):
        for frame in tick.frames:
            ts, values, _ = families.setdefault(frame.family, ([], [], frame))
            ts.append(frame.ts)
            values.append(frame.values)
        if progress is not None:
            progress(k + 1, run.n_ticks)
    (out / "metrics").mkdir(exist_ok=True)
    samples = 0
    for family, (ts, values, first) in families.items():
        cube = np.stack(values)
        samples += cube.size
        np.savez_compressed(out / "metrics" / f"{family}.npz", ts=np.array(ts), entities=np.array(first.entities),
                            metrics=np.array(first.metrics), values=cube)
    return {"ticks": run.n_ticks, "samples": samples, "events": len(run.events), "log_lines": len(run.logs),
            "faults": len(run.ground_truth)}


@dataclass
class SimFiles:
    """A simulated run read back from disk."""

    root: Path
    topology: Topology
    ground_truth: list[GroundTruthFault]
    events: list[Event]

    def frames(self, family: str) -> Iterator[MetricFrame]:
        path = self.root / "metrics" / f"{family}.npz"
        if not path.exists():
            raise VigilInputError(f"{path} does not exist (families: gpu, node, nic, job)")
        with np.load(path) as data:
            entities = [str(e) for e in data["entities"]]
            metrics = [str(m) for m in data["metrics"]]
            for ts, values in zip(data["ts"], data["values"], strict=True):
                yield MetricFrame(float(ts), family, entities, metrics, values)

    def logs(self) -> Iterator[LogRecord]:
        for path in sorted((self.root / "logs").rglob("*.log")):
            rel = path.relative_to(self.root / "logs")
            if rel.parts[0] in ("kernel", "kubernetes"):
                entity = f"node/{path.stem}"
            else:
                entity = f"job/{rel.parts[1]}/rank/{int(path.stem.split('-')[1])}"
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                yield LogRecord(entity=entity, source=rel.parts[0], line=line, lineno=n)


def _jsonl(path: Path, model: type[Event] | type[GroundTruthFault]) -> list[Any]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(model.model_validate_json(line))
            except ValueError as err:
                raise VigilInputError(f"{path}:{n}: not a valid {model.__name__} record "
                                      f"({str(err).splitlines()[0]})") from None
    return out


def load_sim(root: Path) -> SimFiles:
    if not (root / "topology.json").exists():
        raise VigilInputError(f"{root} is not a simulated run (no topology.json); write one with `vigil sim --out`")
    try:
        topology = Topology.model_validate_json((root / "topology.json").read_text())
    except ValueError as err:
        raise VigilInputError(f"{root / 'topology.json'}: {str(err).splitlines()[0]}") from None
    return SimFiles(root=root, topology=topology, ground_truth=_jsonl(root / "ground_truth.jsonl", GroundTruthFault),
                    events=_jsonl(root / "events.jsonl", Event))
