"""GPU reset on the node itself: ``nvidia-smi --gpu-reset -i N``, run by the node agent.

NVIDIA's driver refuses a reset while any process holds the GPU, so the policy puts this after a
drain; the refusal comes back as a FAILED action with nvidia-smi's message. Only GPUs of the node this
actuator runs on are accepted (``node`` is this machine's name as in the topology).
Tested with a fake ``nvidia-smi`` on PATH; no GPU runs in CI.
"""

from __future__ import annotations

from vigil.model import Action, ActionKind, parse_entity
from vigil.remedy.actuators.base import Actuator, run_command


class GpuResetActuator(Actuator):
    name = "nvidia-smi"
    kinds = frozenset({ActionKind.RESET_GPU})
    target_kinds = frozenset({"gpu"})

    def __init__(self, node: str, nvidia_smi: str = "nvidia-smi", timeout_s: float = 120.0) -> None:
        self.node = node
        self.nvidia_smi = nvidia_smi
        self.timeout_s = timeout_s

    def accepts(self, action: Action) -> bool:
        return super().accepts(action) and parse_entity(action.target)[1][0] == self.node

    def command(self, action: Action) -> list[str]:
        index = parse_entity(action.target)[1][1]
        return [self.nvidia_smi, "--gpu-reset", "-i", index]

    def describe(self, action: Action) -> str:
        return "run " + " ".join(self.command(action))

    def execute(self, action: Action) -> str:
        done = run_command(self.command(action), self.timeout_s, f"GPU reset of {action.target}")
        output = (done.stdout + done.stderr).strip().splitlines()
        return output[0] if output else f"reset {action.target}"
