"""One loader per ``--format``: the public data sets' layouts (``datasets``) and a simulated run (``simdata``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vigil.model import VigilInputError
from vigil_eval.datasets import Dataset, load_asd, load_csv, load_nab
from vigil_eval.simdata import load_sim_dataset

FORMATS = ("asd", "nab", "csv", "sim")


def load(fmt: str, root: Path, entities: Sequence[str] | None = None) -> Dataset:
    """Dispatch on ``--format``."""
    if fmt == "asd":
        return load_asd(root, entities)
    if fmt == "nab":
        return load_nab(root, entities)
    if fmt == "csv":
        return load_csv(root, entities)
    if fmt == "sim":
        return load_sim_dataset(root, entities)
    raise VigilInputError(f"unknown data format {fmt!r}: expected one of {', '.join(FORMATS)}")
