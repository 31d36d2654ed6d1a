"""Stack aggregation: merge every rank's stacks into a prefix tree and find where the odd ranks fork off.

Ranks with identical stacks are merged before the tree is built (STAT's equivalence classes), so the
cost grows with the number of distinct stacks, not the number of ranks: 10,000 ranks take a few
milliseconds when they are in a handful of states.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vigil.model import VigilInputError

Frame = str
# rank -> thread name -> frames, outermost first
RankStacks = dict[int, dict[str, list[Frame]]]

MAIN_THREAD = "MainThread"
# Frames that only say "the probe wrapped this call"; they never tell ranks apart usefully.
_NOISE_FILES = (
    "vigil/sources/probe/hooks.py",
    "vigil/sources/probe/bootstrap.py",
    "torch/distributed/c10d_logger.py",
    "<frozen runpy>",
)


# The probe's own watchdog thread: its stack says when it last wrote a snapshot, nothing about the job.
_NOISE_THREADS = ("vigil-probe",)


def _is_noise(filename: str) -> bool:
    return any(filename.endswith(noise) for noise in _NOISE_FILES)


def frame_label(name: str, filename: str, line: int | None) -> Frame:
    short = "/".join(Path(filename).parts[-2:]) if filename else "?"
    return f"{name} ({short}:{line})" if line is not None else f"{name} ({short})"


_PARTS = re.compile(r"^(?P<name>.+?) \((?P<file>[^():]+)(:(?P<line>[\d,]+))?\)$")
_LINE = re.compile(r"^(?P<func>.*):(?P<line>\d+)\)$")


def function_of(frame: Frame) -> tuple[str, str | None]:
    """``"f (a.py:12)"`` -> ``("f (a.py)", "12")``: ranks in the same function at different lines
    (different loop iterations, a different branch) are the same node of the tree."""
    match = _LINE.match(frame)
    if match is None:
        return frame, None
    return match.group("func") + ")", match.group("line")


@dataclass
class StackNode:
    frame: Frame
    ranks: set[int] = field(default_factory=set)
    children: dict[Frame, StackNode] = field(default_factory=dict)
    lines: dict[str, set[int]] = field(default_factory=dict)

    @property
    def label(self) -> Frame:
        """The function with every line number seen there, most common first."""
        if not self.lines:
            return self.frame
        ordered = sorted(self.lines, key=lambda line: -len(self.lines[line]))
        return self.frame[:-1] + ":" + ",".join(ordered) + ")"

    def label_for(self, ranks: set[int]) -> Frame:
        """The function with only the lines where ``ranks`` are."""
        lines = [line for line, seen in self.lines.items() if seen & ranks]
        if not lines:
            return self.frame
        return self.frame[:-1] + ":" + ",".join(sorted(lines, key=int)) + ")"


@dataclass
class ForkPoint:
    """Where the odd ranks' stack leaves the majority's, in one thread."""

    thread: str
    parent: Frame | None
    frame: Frame
    majority_frame: Frame | None
    ranks: list[int]
    majority_ranks: list[int]

    def to_dict(self) -> dict[str, Any]:
        """Also spelled as one frame (name, filename, line) for readers that want just that."""
        match = _PARTS.match(self.frame)
        return {
            "name": match.group("name") if match else self.frame,
            "filename": match.group("file") if match else "",
            "line": int(match.group("line").split(",")[0]) if match and match.group("line") else None,
            "thread": self.thread,
            "parent": self.parent,
            "frame": self.frame,
            "majority_frame": self.majority_frame,
            "ranks": self.ranks,
            "majority_ranks": self.majority_ranks,
        }


@dataclass
class StackTree:
    """A prefix tree per thread name; each node holds the set of ranks whose stack passes through it."""

    roots: dict[str, StackNode]
    classes: list[tuple[list[int], dict[str, list[Frame]]]]

    def fork_points(self) -> list[ForkPoint]:
        """The first divergence of each thread, main thread first, smallest odd group first."""
        forks = []
        for thread, root in self.roots.items():
            fork = _fork_in(thread, root)
            if fork is not None:
                forks.append(fork)
        forks.sort(key=lambda f: (f.thread != MAIN_THREAD, len(f.ranks)))
        return forks

    def fork_of(self, culprits: set[int], thread: str = MAIN_THREAD) -> ForkPoint | None:
        """Where the culprits' stack leaves every other rank's: follow the culprits down the tree to the first
        node no other rank passes through. None when the culprits' stack ends where others' does too (they
        look like a rank that waits), or there is no such thread."""
        node = self.roots.get(thread)
        if node is None or not (node.ranks & culprits) or node.ranks <= culprits:
            return None
        parent: Frame | None = None
        while True:
            inside = [child for child in node.children.values() if child.ranks & culprits]
            others = [child for child in node.children.values() if not child.ranks & culprits]
            majority = max(others, key=lambda c: len(c.ranks), default=None)
            if not inside:
                if (node.ranks - culprits) - set().union(*(c.ranks for c in others)):
                    return None  # another rank's stack ends here too: the culprits look like it
                # The culprits stop here while the others go deeper.
                odd = node.ranks & culprits
                here = node.label_for(odd)
                return ForkPoint(thread=thread, parent=here, frame=f"(stack ends in {here})",
                                 majority_frame=majority.label_for(majority.ranks) if majority else None,
                                 ranks=sorted(odd), majority_ranks=sorted(majority.ranks) if majority else [])
            child = max(inside, key=lambda c: len(c.ranks & culprits))
            if child.ranks <= culprits:
                ended = node.ranks - set().union(*(c.ranks for c in node.children.values()))
                majority_frame = majority.label_for(majority.ranks) if majority else None
                majority_ranks = majority.ranks if majority else set()
                if len(ended) > len(majority_ranks):
                    majority_frame, majority_ranks = f"(stack ends in {node.label_for(ended)})", ended
                return ForkPoint(thread=thread, parent=node.label_for(child.ranks) if parent is not None else None,
                                 frame=child.label_for(child.ranks), majority_frame=majority_frame,
                                 ranks=sorted(child.ranks), majority_ranks=sorted(majority_ranks))
            parent = child.label
            node = child

    def render(self, max_depth: int = 40) -> str:
        lines: list[str] = []
        for thread, root in self.roots.items():
            lines.append(f"[{thread}] ranks {_ranges(root.ranks)}")
            _render(root, 1, lines, max_depth)
        return "\n".join(lines)


def _fork_in(thread: str, root: StackNode) -> ForkPoint | None:
    node = root
    parent: Frame | None = None
    while True:
        if not node.children:
            return None
        if len(node.children) == 1:
            child = next(iter(node.children.values()))
            if child.ranks == node.ranks:
                parent = child.label
                node = child
                continue
        # Ranks that end here (their stack is shorter) form their own group.
        groups = sorted(node.children.values(), key=lambda c: -len(c.ranks))
        majority = groups[0]
        ended = node.ranks - set().union(*(c.ranks for c in groups))
        if len(ended) > len(majority.ranks):
            # Most ranks stop here (they wait inside this frame's native call); the odd ones went deeper,
            # into Python the others never reached (a custom autograd Function's backward, say).
            deeper = set(node.ranks) - ended
            return ForkPoint(
                thread=thread,
                parent=node.label_for(deeper) if node is not root else parent,
                frame=majority.label_for(majority.ranks),
                majority_frame=f"(stack ends in {node.label_for(ended) if node is not root else parent})",
                ranks=sorted(deeper),
                majority_ranks=sorted(ended),
            )
        odd = set(node.ranks) - majority.ranks
        if not odd:
            return None
        odd_child = groups[1] if len(groups) > 1 else None
        frame = odd_child.label_for(odd_child.ranks) if odd_child is not None else f"(stack ends in {parent})"
        if ended and (odd_child is None or len(ended) > len(odd_child.ranks)):
            frame = f"(stack ends in {parent})"
        if node is not root and odd:
            parent = node.label_for(odd)
        return ForkPoint(
            thread=thread,
            parent=parent,
            frame=frame,
            majority_frame=majority.label_for(majority.ranks),
            ranks=sorted(odd),
            majority_ranks=sorted(majority.ranks),
        )


def merge_stacks(stacks: RankStacks) -> StackTree:
    """Build the prefix tree; identical stacks are merged first."""
    classes: dict[tuple[tuple[str, tuple[Frame, ...]], ...], list[int]] = defaultdict(list)
    for rank, threads in stacks.items():
        key = tuple(sorted((name, tuple(frames)) for name, frames in threads.items()))
        classes[key].append(rank)
    roots: dict[str, StackNode] = {}
    for key, ranks in classes.items():
        rank_set = set(ranks)
        for thread, frames in key:
            node = roots.setdefault(thread, StackNode(frame=thread))
            node.ranks |= rank_set
            for frame in frames:
                function, line = function_of(frame)
                child = node.children.get(function)
                if child is None:
                    child = node.children[function] = StackNode(frame=function)
                child.ranks |= rank_set
                if line is not None:
                    child.lines.setdefault(line, set()).update(rank_set)
                node = child
    ordered = sorted(classes.items(), key=lambda item: -len(item[1]))
    return StackTree(
        roots=roots,
        classes=[(sorted(ranks), {t: list(f) for t, f in key}) for key, ranks in ordered],
    )


# A main-thread frame in one of these files means the rank is inside a collective (eager c10d, functional
# collectives, DDP / FSDP2 waiting on their works).
_COLLECTIVE_FILES = (
    "distributed/distributed_c10d.py",
    "distributed/_functional_collectives.py",
    "_composable/fsdp/_fsdp_collectives.py",
    "fsdp/_fully_shard/_fsdp_collectives.py",
)


def in_collective(frames: list[Frame]) -> bool:
    for frame in frames:
        match = _PARTS.match(frame)
        if match is not None and match.group("file").endswith(_COLLECTIVE_FILES):
            return True
    return False


def collective_split(stacks: RankStacks) -> tuple[list[int], list[int]] | None:
    """(ranks waiting in a collective, ranks elsewhere) from every rank's main-thread stack, or None when
    the stacks do not split the job that way. A collective is recognised by its frames; one issued from
    C++ or a compiled graph leaves none, so then two stack classes, one a strict minority, split the job
    the same way: the many wait, the few are elsewhere."""
    main = {r: threads.get(MAIN_THREAD, []) for r, threads in stacks.items()}
    waiting = sorted(r for r, frames in main.items() if in_collective(frames))
    outside = sorted(r for r in main if r not in waiting)
    if waiting and outside:
        return waiting, outside
    classes: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for rank, frames in main.items():
        classes[tuple(function_of(f)[0] for f in frames)].append(rank)
    if len(classes) != 2:
        return None
    few, many = sorted(classes.values(), key=len)
    return (sorted(many), sorted(few)) if len(few) < len(many) else None


def _ranges(ranks: set[int] | list[int]) -> str:
    ordered = sorted(ranks)
    if not ordered:
        return "[]"
    spans = []
    start = prev = ordered[0]
    for rank in ordered[1:]:
        if rank == prev + 1:
            prev = rank
            continue
        spans.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = rank
    spans.append(f"{start}-{prev}" if prev > start else str(start))
    return "[" + ",".join(spans) + "]"


def _render(node: StackNode, depth: int, lines: list[str], max_depth: int) -> None:
    if depth > max_depth:
        return
    for child in sorted(node.children.values(), key=lambda c: -len(c.ranks)):
        lines.append(f"{'  ' * depth}{child.label}  ranks {_ranges(child.ranks)}")
        _render(child, depth + 1, lines, max_depth)


# ----------------------------------------------------------------------------- inputs


def from_pyspy(dump: list[dict[str, Any]], include_idle_threads: bool = True) -> dict[str, list[Frame]]:
    """Threads of one `py-spy dump --json` (innermost frame first there) -> outermost-first frames."""
    threads: dict[str, list[Frame]] = {}
    for thread in dump:
        if not isinstance(thread, dict) or "frames" not in thread:
            raise VigilInputError("py-spy dump: expected a list of threads with 'frames'")
        frames = [
            frame_label(str(f.get("name", "?")), str(f.get("filename", "")), f.get("line"))
            for f in reversed(thread["frames"])
            if not _is_noise(str(f.get("filename", "")))
        ]
        name = thread.get("thread_name")
        if not name:
            # py-spy only knows names of threads the threading module has seen; the main thread's
            # OS id is the process id.
            is_main = thread.get("os_thread_id") is not None and thread.get("os_thread_id") == thread.get("pid")
            name = MAIN_THREAD if is_main else str(thread.get("thread_id"))
        if (include_idle_threads or thread.get("active")) and name not in _NOISE_THREADS:
            threads[_unique(threads, str(name))] = frames
    return threads


def from_python_stacks(stacks: list[dict[str, Any]]) -> dict[str, list[Frame]]:
    """The probe's own in-process stacks (outermost first already)."""
    threads: dict[str, list[Frame]] = {}
    for thread in stacks:
        frames = [
            frame_label(str(f["name"]), str(f["filename"]), f.get("line"))
            for f in thread["frames"]
            if not _is_noise(str(f["filename"]))
        ]
        if thread["thread_name"] not in _NOISE_THREADS:
            threads[_unique(threads, str(thread["thread_name"]))] = frames
    return threads


def _unique(threads: dict[str, list[Frame]], name: str) -> str:
    if name not in threads:
        return name
    index = 2
    while f"{name}#{index}" in threads:
        index += 1
    return f"{name}#{index}"


def load_stacks(path: Path) -> RankStacks:
    """Read ``stacks.json`` (rank -> py-spy threads) as written by the supervisor."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise VigilInputError(f"stack file {path} does not exist") from None
    except json.JSONDecodeError as err:
        raise VigilInputError(f"stack file {path} is not valid JSON: {err.msg} at line {err.lineno}") from None
    if not isinstance(data, dict):
        raise VigilInputError(f"stack file {path}: expected an object of rank -> threads")
    result: RankStacks = {}
    for rank, entry in data.items():
        if not isinstance(entry, dict) or "threads" not in entry:
            raise VigilInputError(f"stack file {path}: rank {rank} has no 'threads'")
        try:
            result[int(rank)] = {str(k): list(v) for k, v in entry["threads"].items()}
        except (ValueError, AttributeError):
            raise VigilInputError(f"stack file {path}: bad entry for rank {rank!r}") from None
    return result
