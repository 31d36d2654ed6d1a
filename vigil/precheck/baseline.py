"""Per-hardware-type baselines and the good / bad verdict.

A baseline file maps a hardware key (CPU model, GPU model and count, rank count) to the expected
value of each check. A check fails when it is worse than its baseline by more than the tolerance
(default 50%: the point is to catch a machine that is broken or badly degraded, not 5% noise).
Checks that decide on their own (NVML health) fail on any problem regardless of the baseline.
"""

from __future__ import annotations

import enum
import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vigil.model import Anomaly, Evidence, FaultLevel, VigilInputError, node_id
from vigil.precheck.checks import CheckResult


def hardware_key(world_size: int) -> str:
    """What results are comparable across: same CPU, same GPUs, same number of ranks."""
    import torch

    cpu = _cpu_model()
    gpu = "no-gpu"
    if torch.cuda.is_available():
        gpu = f"{torch.cuda.get_device_name(0)}x{torch.cuda.device_count()}"
    return f"{cpu} | {gpu} | ranks={world_size}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass
class Baselines:
    path: Path
    entries: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> Baselines:
        path = Path(path)
        if not path.exists():
            return cls(path)
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise VigilInputError(f"baseline file {path} is not valid JSON: {err}") from None
        except OSError as err:
            raise VigilInputError(f"baseline file {path} cannot be read: {err.strerror or err}") from None
        if not isinstance(data, dict) or not all(
            isinstance(v, dict) and all(isinstance(x, int | float) for x in v.values()) for v in data.values()
        ):
            raise VigilInputError(f"baseline file {path}: expected {{hardware key: {{check name: number}}}}")
        return cls(path, {k: {n: float(x) for n, x in v.items()} for k, v in data.items()})

    def save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.entries, indent=2, sort_keys=True))
            tmp.replace(self.path)
        except OSError as err:
            raise VigilInputError(f"baseline file {self.path} cannot be written: {err.strerror or err}") from None

    def record(self, key: str, results: list[CheckResult]) -> None:
        """Store the median of every rank's result per check as the baseline for ``key``."""
        by_name: dict[str, list[float]] = {}
        for result in results:
            if result.value is not None and not result.skipped and not result.name.startswith("nvml_health"):
                by_name.setdefault(result.name, []).append(result.value)
        self.entries[key] = {name: sorted(values)[len(values) // 2] for name, values in by_name.items()}


class Verdict(enum.StrEnum):
    GOOD = "good"
    BAD = "bad"
    NO_BASELINE = "no baseline"  # nothing failed, but no performance check had a baseline to meet


@dataclass
class MachineVerdict:
    host: str
    verdict: Verdict
    failing: list[str]
    checks: list[CheckResult]

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "verdict": self.verdict.value,
            "failing": self.failing,
            "checks": [c.to_dict() for c in self.checks],
        }

    def to_anomaly(self, ts: float) -> Anomaly | None:
        """A bad machine as an Anomaly (fault type ``precheck:<first failing check>``), for the policies.

        NVML health problems are DRAIN (reset or reboot needed); a performance shortfall is DEGRADED.
        """
        if self.verdict is not Verdict.BAD:
            return None
        failed = [c for c in self.checks if c.ok is False]
        level = FaultLevel.DRAIN if any(c.name.startswith("nvml_health") for c in failed) else FaultLevel.DEGRADED
        entity = node_id(self.host)
        evidence = [
            Evidence(
                kind="precheck",
                entity=entity,
                ts=ts,
                summary=f"{c.name} = {c.value:.4g} {c.unit}"
                + (f" vs baseline {c.baseline:.4g}" if c.baseline is not None else "")
                + f" ({c.detail})",
                metric=c.name,
                value=c.value,
            )
            for c in failed
            if c.value is not None
        ]
        return Anomaly(
            entity=entity,
            start=ts,
            end=ts,
            detector="precheck",
            fault_type=f"precheck:{self.failing[0]}",
            level=level,
            evidence=evidence,
        )


def judge(result: CheckResult, baseline: dict[str, float], tolerance: float) -> CheckResult:
    if result.skipped or result.value is None:
        return result
    if result.name.startswith("nvml_health"):
        result.ok = result.value == 0
        return result
    expected = baseline.get(result.name)
    result.baseline = expected
    if expected is None:
        result.ok = True
        result.detail = (result.detail + "; no baseline").lstrip("; ")
    elif result.higher_is_better:
        result.ok = result.value >= expected * (1 - tolerance)
    else:
        result.ok = result.value <= expected * (1 + tolerance)
    return result


def verdicts(
    per_rank: list[tuple[str, list[CheckResult]]], baseline: dict[str, float], tolerance: float = 0.5
) -> list[MachineVerdict]:
    """Group rank results by host and judge each machine: bad if any check on it failed; without a failure,
    "no baseline" when none of its performance checks had a baseline (measured, not judged), else good."""
    hosts: dict[str, list[CheckResult]] = {}
    for host, results in per_rank:
        hosts.setdefault(host, []).extend(judge(r, baseline, tolerance) for r in results)
    out = []
    for host, results in sorted(hosts.items()):
        failing = sorted({r.name for r in results if r.ok is False})
        measured = [r for r in results
                    if not r.skipped and r.value is not None and not r.name.startswith("nvml_health")]
        unjudged = bool(measured) and all(r.baseline is None for r in measured)
        verdict = Verdict.BAD if failing else Verdict.NO_BASELINE if unjudged else Verdict.GOOD
        out.append(MachineVerdict(host, verdict, failing, results))
    return out
