"""A metamorphic check of root-error triage: the development cases of the real corpus re-rendered the way other
collectors deliver the same lines, with the labelled root line followed to its new line number.

The held-out logs were collected by other people through other collectors; a rule fitted to the development cases'
exact text may rely on how their collector delivered the lines. Each transform here is what one real producer
does to every line it relays (a prefix, a time, a line ending, colour around the level, a second process's lines
in between) - never an edit of the text inside a line - so triage should name the same root line after it.

Collector times: a collector stamps a line when it is written. The stamp a transform writes is the time triage
already gives the line - its own time, or for an unstamped line the next stamp below it in its file (the last one
above after the last stamp), as :mod:`vigil.logs.triage` dates unstamped lines - so the check tests the reading of
the prefix, not a new order of events. A file without any time of its own gets a clock a minute after the case's
latest time, a millisecond a line (its lines stay within triage's tie window of each other, in file order).
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from vigil.knowledge.line_prefix import LINE_RANK_PREFIX, split_prefix
from vigil.knowledge.signatures import SignatureMatcher
from vigil.logs.sources import classify
from vigil.logs.timestamps import line_time
from vigil.logs.triage import triage
from vigil_eval.realcorpus import RealCase

# A rendering of one file: its lines (their line endings included) and, for each original line number (1-based),
# the new one.
Rendered = tuple[list[str], dict[int, int]]
Transform = Callable[[list[str], "FileContext"], Rendered]

UNSTAMPED_CLOCK_START = datetime(2024, 1, 1, tzinfo=UTC).timestamp()


@dataclasses.dataclass(frozen=True)
class FileContext:
    index: int  # the file's place among the case's files (a task number, a rank)
    node_log: bool  # a kernel log / journal (vigil.logs.sources: kind "node")
    times: list[float]  # the collector's stamp of each line (see the module's docstring)


def _one_to_one(lines: list[str], head: Callable[[int, str], str]) -> Rendered:
    return [head(i, line) + line + "\n" for i, line in enumerate(lines)], {n: n for n in range(1, len(lines) + 1)}


def _rfc3339nano(ts: float, fixed: bool) -> str:
    """Go's time.RFC3339Nano in UTC (trailing zeros of the fraction trimmed) or Docker's RFC3339NanoFixed (nine
    digits always). A float holds microseconds; the nanoseconds are zero."""
    moment = datetime.fromtimestamp(ts, tz=UTC)
    fraction = f"{moment.microsecond:06d}000"
    if not fixed:
        fraction = fraction.rstrip("0")
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"


def cri(lines: list[str], ctx: FileContext) -> Rendered:
    """The CRI log format containerd and CRI-O write under /var/log/pods (kubelet's logs/logs.go:
    "<RFC3339Nano time> <stream> <P|F> <line>", F marking a full line). A node's kernel log is not a container's."""
    if ctx.node_log:
        return _one_to_one(lines, lambda i, line: "")
    return _one_to_one(lines, lambda i, line: f"{_rfc3339nano(ctx.times[i], fixed=False)} stderr F ")


def docker_timestamps(lines: list[str], ctx: FileContext) -> Rendered:
    """`docker logs -t` over the json-file driver: each decoded line after its time in RFC3339NanoFixed and a space
    (docker's api/types/jsonmessage RFC3339NanoFixed)."""
    if ctx.node_log:
        return _one_to_one(lines, lambda i, line: "")
    return _one_to_one(lines, lambda i, line: f"{_rfc3339nano(ctx.times[i], fixed=True)} ")


def kubectl_prefix(lines: list[str], ctx: FileContext) -> Rendered:
    """`kubectl logs --prefix`: "[pod/<pod>/<container>] " before each line of the container's log."""
    if ctx.node_log:
        return _one_to_one(lines, lambda i, line: "")
    return _one_to_one(lines, lambda i, line: f"[pod/trainer-worker-{ctx.index}/pytorch] ")


def srun_label(lines: list[str], ctx: FileContext) -> Rendered:
    """`srun --label`: the task number and ": " before each line the task printed (the number right-aligned to
    the width of the largest one; one digit here)."""
    if ctx.node_log:
        return _one_to_one(lines, lambda i, line: "")
    return _one_to_one(lines, lambda i, line: f"{ctx.index % 10}: ")


_SHORT_MONTH = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def journald_short(lines: list[str], ctx: FileContext) -> Rendered:
    """`journalctl -o short`: "Mmm dd HH:MM:SS <host> <identifier>[<pid>]: " (the kernel's lines as "kernel: ",
    without a pid); seconds only, no year."""
    ident = "kernel" if ctx.node_log else "python3[4242]"

    def head(i: int, line: str) -> str:
        moment = datetime.fromtimestamp(ctx.times[i], tz=UTC)
        return f"{_SHORT_MONTH[moment.month - 1]} {moment.day:02d} {moment:%H:%M:%S} gpu-node-{ctx.index:02d} {ident}: "

    return _one_to_one(lines, head)


def crlf(lines: list[str], ctx: FileContext) -> Rendered:
    """Windows line endings: a log copied through a Windows machine (an editor, a browser download) ends each line
    with CR LF."""
    return [line + "\r\n" for line in lines], {n: n for n in range(1, len(lines) + 1)}


_LEVEL_WORD = re.compile(r"\b(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b")
_LEVEL_COLOUR = {"DEBUG": 36, "INFO": 32, "WARNING": 33, "WARN": 33, "ERROR": 31, "CRITICAL": 41, "FATAL": 41}
LEVEL_HEAD = 60  # a formatter's level field stands near the head of its line


def ansi_level(lines: list[str], ctx: FileContext) -> Rendered:
    """A colouring log formatter writing to a terminal that is captured (colorlog, coloredlogs, uvicorn's
    DefaultFormatter): the level name of each line between SGR colour codes, "\\x1b[31mERROR\\x1b[0m". The level
    field is the first level word near the head of the line; the kernel does not colour its log."""
    def render(line: str) -> str:
        found = _LEVEL_WORD.search(line, 0, LEVEL_HEAD)
        if ctx.node_log or found is None:
            return line + "\n"
        word = found[1]
        return f"{line[:found.start()]}\x1b[{_LEVEL_COLOUR[word]}m{word}\x1b[0m{line[found.end():]}\n"

    return [render(line) for line in lines], {n: n for n in range(1, len(lines) + 1)}


def torchrun_rank(lines: list[str], ctx: FileContext) -> Rendered:
    """torch's rank prefix on a worker's output (torchrun --tee / torch.distributed's "[rank0]:" before each line
    of stderr). A file whose lines carry a rank prefix already, or a kernel log, is left as it is."""
    if ctx.node_log or any(LINE_RANK_PREFIX.match(line) for line in lines):
        return _one_to_one(lines, lambda i, line: "")
    return _one_to_one(lines, lambda i, line: f"[rank{ctx.index}]:")


# A healthy rank's progress, as the trainers print it: Hugging Face Trainer's log dict, Megatron-LM's iteration line,
# Lightning's progress bar, DeepSpeed's step report. None of them reads as an error (tests/logs check that).
HEALTHY_RANK = 63
HEALTHY_LINES = (
    "{{'loss': 2.31{k:02d}, 'grad_norm': 0.4{k:02d}, 'learning_rate': 2.9e-05, 'epoch': 0.{k:02d}}}",
    " iteration {k:8d}/  500000 | consumed samples: {s:12d} | elapsed time per iteration (ms): 412.{k:02d} | "
    "learning rate: 3.000E-04 | lm loss: 2.31{k:02d}E+00 | loss scale: 65536.0 | grad norm: 0.4{k:02d} |",
    "Epoch 0:  45%|####5     | {k}/1000 [02:15<02:45,  3.32it/s, loss=2.31, v_num=0]",
    "[Rank {r}] step={k}, skipped=0, lr=[3e-05], mom=[(0.9, 0.999)]",
)


def interleaved_rank(lines: list[str], ctx: FileContext) -> Rendered:
    """A job-wide log (torchrun --tee, a launcher's combined output) holds every rank's lines under torch's
    "[rankN]:" prefix: another, healthy rank's progress lines between the case's lines, one after every
    third. A kernel log is left as it is."""
    if ctx.node_log:
        return _one_to_one(lines, lambda i, line: "")
    out: list[str] = []
    mapping: dict[int, int] = {}
    for n, line in enumerate(lines, 1):
        out.append(line + "\n")
        mapping[n] = len(out)
        if n % 3 == 0:
            k = n // 3
            text = HEALTHY_LINES[k % len(HEALTHY_LINES)].format(k=k % 100, s=k * 128, r=HEALTHY_RANK)
            out.append(f"[rank{HEALTHY_RANK}]:{text}\n")
    return out, mapping


TRANSFORMS: dict[str, Transform] = {
    "cri": cri,
    "docker_timestamps": docker_timestamps,
    "kubectl_prefix": kubectl_prefix,
    "srun_label": srun_label,
    "journald_short": journald_short,
    "crlf": crlf,
    "ansi_level": ansi_level,
    "torchrun_rank": torchrun_rank,
    "interleaved_rank": interleaved_rank,
}


def _own_time(line: str) -> float | None:
    prefix = split_prefix(line)
    stamp = line_time(line if prefix is None else prefix.payload)
    return line_time(line) if stamp is None and prefix is not None and prefix.timed else stamp


def _file_times(lines: list[str], unstamped_start: float) -> list[float]:
    """Each line's time as triage dates it: its own, else the next stamp below, else the last above; a file with
    none a millisecond a line from ``unstamped_start``."""
    own = [_own_time(line) for line in lines]
    if all(t is None for t in own):
        return [unstamped_start + i / 1000 for i in range(len(lines))]
    times: list[float | None] = []
    below: float | None = None
    for stamp in reversed(own):
        below = stamp if stamp is not None else below
        times.append(below)
    times.reverse()
    above: float | None = None
    for i, stamp in enumerate(own):  # after the last stamp: the last one above
        above = stamp if stamp is not None else above
        if times[i] is None:
            times[i] = above
    return [t for t in times if t is not None]


def case_files(case: RealCase) -> list[Path]:
    return sorted(p for p in case.directory.rglob("*") if p.is_file())


def render_case(case: RealCase, transform: Transform, into: Path) -> RealCase:
    """The case's files re-rendered by ``transform`` under ``into`` (same names), and the case with its root lines
    followed there."""
    files = case_files(case)
    texts = {path: path.read_text(encoding="utf-8").splitlines() for path in files}
    stamps = [t for lines in texts.values() for line in lines if (t := _own_time(line)) is not None]
    unstamped_start = (max(stamps) + 60.0) if stamps else UNSTAMPED_CLOCK_START
    maps: dict[str, dict[int, int]] = {}
    for index, path in enumerate(files):
        lines = texts[path]
        name = path.relative_to(case.directory).as_posix()
        ctx = FileContext(index=index, node_log=classify(path, case.directory).kind == "node",
                          times=_file_times(lines, unstamped_start))
        out, maps[name] = transform(lines, ctx)
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("w", encoding="utf-8", newline="") as handle:
            handle.write("".join(out))
    root_map = maps[case.root_file]
    return dataclasses.replace(case, directory=into, root_line=root_map[case.root_line],
                               also_lines=tuple(root_map[n] for n in case.also_lines))


@dataclasses.dataclass(frozen=True)
class RobustOutcome:
    transform: str
    case_id: str
    right: bool
    named: str | None


def check(cases: list[RealCase], transforms: dict[str, Transform] | None = None,
          matcher: SignatureMatcher | None = None) -> Iterator[RobustOutcome]:
    """Triage on every case under every transform (development cases only: the caller passes them)."""
    matcher = matcher or SignatureMatcher()
    for name, transform in (transforms or TRANSFORMS).items():
        for case in cases:
            with tempfile.TemporaryDirectory(prefix="vigil-robust-") as tmp:
                moved = render_case(case, transform, Path(tmp) / case.id)
                result = triage(moved.directory, job=case.id, workers=1, matcher=matcher)
            named = None if result.root is None else f"{result.root.source}:{result.root.lineno}"
            yield RobustOutcome(name, case.id, moved.accepts(result), named)


def score(cases: list[RealCase]) -> dict[str, dict[str, object]]:
    """Per transform: development cases right, their number, and the ids of the misses."""
    table: dict[str, dict[str, object]] = {}
    for outcome in check(cases):
        row = table.setdefault(outcome.transform, {"right": 0, "cases": 0, "misses": []})
        row["cases"] = int(row["cases"]) + 1  # type: ignore[call-overload]
        if outcome.right:
            row["right"] = int(row["right"]) + 1  # type: ignore[call-overload]
        else:
            row["misses"].append(outcome.case_id)  # type: ignore[attr-defined]
    return table
