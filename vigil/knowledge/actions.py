"""The remediation whitelist (``data/kb/actions.yaml``): each ``ActionKind`` with the only command it may
carry. Commands are rendered from these templates with validated entity parts, never taken from an LLM or a log."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, field_validator

from vigil.knowledge.files import kb_dir, read_data
from vigil.model import ActionKind


class ActionEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    target: str = "any"
    command: str


class ActionFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int
    actions: dict[ActionKind, ActionEntry]

    @field_validator("actions", mode="before")
    @classmethod
    def _whitelisted(cls, value: object) -> object:
        if isinstance(value, dict):
            known = {a.value for a in ActionKind}
            for name in value:
                if name not in known:
                    raise ValueError(f"action {name!r} is not in vigil.model.ActionKind")
        return value

    @field_validator("actions")
    @classmethod
    def _complete(cls, value: dict[ActionKind, ActionEntry]) -> dict[ActionKind, ActionEntry]:
        missing = sorted(a.value for a in set(ActionKind) - set(value))
        if missing:
            raise ValueError(f"no command template for {missing}")
        return value


def load_action_whitelist(directory: Path | None = None) -> dict[ActionKind, ActionEntry]:
    return read_data((directory or kb_dir()) / "actions.yaml", ActionFile, "knowledge base file").actions


@lru_cache(maxsize=1)
def action_whitelist() -> dict[ActionKind, ActionEntry]:
    return load_action_whitelist()
