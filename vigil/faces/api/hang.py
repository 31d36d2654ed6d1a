"""Read the ``diagnosis.json`` that ``vigil launch`` / ``vigil diagnose`` write, for the hang view.

Only the documented keys are relied on (verdict, culprit_ranks, hang_kind, culprit_links, fork_point,
root_error, detected_after_s, evidence); per-rank stacks are looked for under ``stacks`` at the top level or
inside ``evidence``, as ``{rank: [frame, ...]}`` outermost frame first, each frame a string or a mapping with
``name``/``function`` and ``filename``/``file`` and ``line``/``lineno``. Anything else is ignored, so the view
keeps working as the probe adds fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vigil.model import VigilInputError

VERDICTS = ("ok", "hang", "crash", "mismatch", "slow")


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
    verdict: str
    culprit_ranks: list[int]
    hang_kind: str | None
    culprit_links: list[tuple[int, int]]
    fork_point: str | None
    root_error: str | None
    detected_after_s: float | None
    world_size: int
    stacks: dict[int, list[str]]
    raw: dict[str, Any]


def _frame_text(frame: Any) -> str:
    if isinstance(frame, str):
        return frame
    if isinstance(frame, dict):
        if isinstance(frame.get("frame"), str):  # vigil launch's fork_point carries the rendered frame
            return str(frame["frame"])
        name = frame.get("name") or frame.get("function") or frame.get("func") or "?"
        where = frame.get("filename") or frame.get("file") or ""
        line = frame.get("line") or frame.get("lineno")
        return f"{name} ({where}:{line})" if where else str(name)
    return str(frame)


def _find_stacks(data: dict[str, Any]) -> dict[int, list[str]]:
    candidates: list[Any] = [data.get("stacks")]
    evidence = data.get("evidence")
    if isinstance(evidence, dict):
        candidates.append(evidence.get("stacks"))
    elif isinstance(evidence, list):
        candidates.extend(item.get("stacks") for item in evidence if isinstance(item, dict))
    for found in candidates:
        if isinstance(found, dict) and found:
            stacks = {}
            for rank, frames in found.items():
                if str(rank).isdigit() and isinstance(frames, list):
                    stacks[int(rank)] = [_frame_text(f) for f in frames]
            if stacks:
                return stacks
    return {}


def load_hang_report(path: Path) -> HangReport:
    """Parse ``path`` (a diagnosis.json, or a directory holding one) with one clear error if it is bad."""
    file = path / "diagnosis.json" if path.is_dir() else path
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise VigilInputError(f"{file}: no such file (vigil launch writes DIR/diagnosis.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise VigilInputError(f"{file}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise VigilInputError(f"{file}: expected a JSON object at the top level")
    verdict = data.get("verdict")
    if verdict not in VERDICTS:
        raise VigilInputError(f"{file}: field 'verdict' is {verdict!r}; expected one of {', '.join(VERDICTS)}")
    try:
        culprits = [int(r) for r in data.get("culprit_ranks") or []]
        links = [(int(a), int(b)) for a, b in data.get("culprit_links") or []]
    except (TypeError, ValueError):
        raise VigilInputError(
            f"{file}: 'culprit_ranks' must be a list of ints and 'culprit_links' a list of [src, dst] pairs"
        ) from None
    stacks = _find_stacks(data)
    fork = data.get("fork_point")
    known_ranks = set(stacks) | set(culprits) | {r for link in links for r in link}
    world = int(data.get("world_size") or (max(known_ranks) + 1 if known_ranks else 0))
    detected = data.get("detected_after_s")
    return HangReport(
        name=file.parent.name,
        verdict=verdict,
        culprit_ranks=culprits,
        hang_kind=data.get("hang_kind"),
        culprit_links=links,
        fork_point=_frame_text(fork) if fork else None,
        root_error=str(data["root_error"]) if data.get("root_error") else None,
        detected_after_s=float(detected) if isinstance(detected, int | float) else None,
        world_size=world,
        stacks=stacks,
        raw=data,
    )


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
