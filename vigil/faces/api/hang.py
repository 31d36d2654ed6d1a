"""Read the ``diagnosis.json`` that ``vigil launch script`` / ``vigil diagnose run`` write, for the hang view.

The file is a ``vigil.model.HangDiagnosis``, validated as one: the view reads its typed fields (fork point,
stack classes, per-rank stacks), never guessed keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from vigil.model import HangDiagnosis, VigilInputError, describe_validation_error


@dataclass
class StackNode:
    """One frame in the merged stack tree of all ranks; ``ranks`` are the ranks whose stack passes here."""

    frame: str
    ranks: list[int]
    depth: int
    children: list[StackNode] = field(default_factory=list)
    is_fork_point: bool = False


@dataclass
class HangReport:
    name: str
    diagnosis: HangDiagnosis
    raw: dict[str, Any]  # the diagnosis as JSON, for templates

    @property
    def verdict(self) -> str:
        return self.diagnosis.verdict

    @property
    def culprit_ranks(self) -> list[int]:
        return self.diagnosis.culprit_ranks

    @property
    def hang_kind(self) -> str | None:
        return self.diagnosis.hang_kind

    @property
    def culprit_links(self) -> list[tuple[int, int]]:
        return [(link[0], link[1]) for link in self.diagnosis.culprit_links if len(link) == 2]

    @property
    def fork_point(self) -> str | None:
        return self.diagnosis.fork_point.frame if self.diagnosis.fork_point else None

    @property
    def root_error(self) -> str | None:
        return self.diagnosis.root_error

    @property
    def detected_after_s(self) -> float | None:
        return self.diagnosis.detected_after_s

    @property
    def stacks(self) -> dict[int, list[str]]:
        return self.diagnosis.stacks

    @property
    def world_size(self) -> int:
        known = set(self.stacks) | set(self.culprit_ranks) | {r for link in self.culprit_links for r in link}
        return self.diagnosis.world_size or (max(known) + 1 if known else 0)


def load_hang_report(path: Path) -> HangReport:
    """Parse ``path`` (a diagnosis.json, or a directory holding one) with one clear error if it is bad."""
    file = path / "diagnosis.json" if path.is_dir() else path
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise VigilInputError(f"{file}: no such file (vigil launch writes DIR/diagnosis.json)") from None
    except OSError as err:
        raise VigilInputError(f"{file}: cannot be read ({err.strerror or err})") from None
    if not raw.lstrip()[:1] == b"{":
        raise VigilInputError(f"{file}: expected a JSON object at the top level")
    try:
        diagnosis = HangDiagnosis.model_validate_json(raw)
    except ValidationError as err:
        if any(e["type"] == "json_invalid" for e in err.errors()):
            raise VigilInputError(f"{file}: not valid JSON ({err.errors()[0]['msg']})") from None
        raise VigilInputError(f"{file}: {describe_validation_error(err)}") from None
    return HangReport(name=file.parent.name, diagnosis=diagnosis, raw=diagnosis.model_dump(mode="json"))


def stack_tree(stacks: dict[int, list[str]], fork_point: str | None = None) -> StackNode:
    """Merge per-rank stacks into a prefix tree and mark the fork point: the named frame if the report
    gives one, else the last frame every rank shares (where the culprit's stack leaves the others')."""
    root = StackNode(frame="<all ranks>", ranks=sorted(stacks), depth=0)
    for rank, frames in sorted(stacks.items()):
        node = root
        for depth, frame in enumerate(frames, start=1):
            child = next((c for c in node.children if c.frame == frame), None)
            if child is None:
                child = StackNode(frame=frame, ranks=[], depth=depth)
                node.children.append(child)
            child.ranks.append(rank)
            node = child
    marked = _mark_named(root, fork_point) if fork_point else False
    if not marked:
        node = root
        while len(node.children) == 1 and len(node.children[0].ranks) == len(root.ranks):
            node = node.children[0]
        if node.children and node is not root:
            node.is_fork_point = True
    return root


def _mark_named(node: StackNode, fork_point: str) -> bool:
    for child in node.children:
        if child.frame == fork_point or fork_point in child.frame:
            child.is_fork_point = True
            return True
        if _mark_named(child, fork_point):
            return True
    return False


def find_reports(dirs: list[Path]) -> dict[str, Path]:
    """diagnosis.json files under the configured launch directories, by run name (the directory name)."""
    found: dict[str, Path] = {}
    for base in dirs:
        candidates = [base / "diagnosis.json", *sorted(base.glob("*/diagnosis.json"))]
        for file in candidates:
            if file.is_file():
                found.setdefault(file.parent.name, file)
    return found
