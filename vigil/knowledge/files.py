"""Reading knowledge data files: one typed model per file, bad content is one line naming file and field."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from vigil.config import read_yaml
from vigil.model import VigilInputError, describe_validation_error

M = TypeVar("M", bound=BaseModel)


def data_dir() -> Path:
    """The package's data directory (``vigil/knowledge/data``)."""
    return Path(str(resources.files("vigil.knowledge.data")))


def kb_dir() -> Path:
    """The knowledge-base directory shipped with the package (``vigil/knowledge/data/kb``)."""
    return data_dir() / "kb"


def parse_as(model: type[M], raw: Any, where: str) -> M:
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise VigilInputError(f"{where}: {describe_validation_error(err)}") from None


def read_data(path: Path, model: type[M], what: str = "knowledge file") -> M:
    """Parse ``path`` (YAML) into ``model``; a missing file, bad YAML or a bad field raises VigilInputError."""
    raw = read_yaml(path, what)
    if not isinstance(raw, dict) or not isinstance(raw.get("version"), int):
        raise VigilInputError(f"{what} {path}: expected a mapping with an integer 'version'")
    return parse_as(model, raw, f"{what} {path}")
