"""The small training job the failover tests run: two gloo ranks of vigil_eval.tinytrain on CPU devices,
checkpointing every 5 steps, restarted twice at most."""

from __future__ import annotations

from vigil.remedy.jobspec import TrainingJob


def tiny_job(name: str, steps: int = 30, hang_timeout: str = "10s") -> TrainingJob:
    return TrainingJob.from_dict(
        {
            "metadata": {"name": name},
            "spec": {
                "replicas": 2,
                "command": ["python", "-m", "vigil_eval.tinytrain", "--steps", str(steps)],
                "devices": ["cpu:0", "cpu:1", "cpu:2"],
                "checkpoint": {"everySteps": 5, "keepLast": 2},
                "failoverPolicy": {"maxRetries": 2, "action": "restart"},
                "healthCheck": {"hangTimeout": hang_timeout},
            },
        }
    )
