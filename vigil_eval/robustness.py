"""A metamorphic check of root-error triage: the development cases of the real corpus re-rendered the way other
collectors deliver the same lines, with the labelled root line followed to its new line number.

The held-out logs were collected by other people through other collectors; a rule fitted to the development cases'
exact text may rely on how their collector delivered the lines. Each transform here is what one real producer
does to every line it relays (a prefix, a time, a line ending, colour around the level, a second process's lines
in between, a Markdown margin, a terminal's cuts at its width) - never an edit of the text inside a line - so triage
should name the same root line after it.

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
# A rendering into several files: each one's suffix (replacing the file's own last suffix) and its rendering, the
# mapping holding the original lines that went to it.
Streams = dict[str, Rendered]
Transform = Callable[[list[str], "FileContext"], Rendered | Streams]

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


def mpirun_tag_output(lines: list[str], ctx: FileContext) -> Rendered:
    """Open MPI's `mpirun --tag-output` (Horovod's too): "[<job>,<rank>]<stderr>:" before each line a rank wrote,
    with no space after the colon (orte/mca/iof/base/iof_base_output.c: "[%s,%s]<%s>:")."""
    if ctx.node_log:
        return _one_to_one(lines, lambda i, line: "")
    return _one_to_one(lines, lambda i, line: f"[1,{ctx.index}]<stderr>:")


def pdsh_host(lines: list[str], ctx: FileContext) -> Rendered:
    """pdsh, and DeepSpeed's multi-node runner through it: the host and ": " before each line the remote command
    printed (dshbak(1): "the leading 'node:' is stripped"); hosts named as in a DeepSpeed hostfile."""
    if ctx.node_log:
        return _one_to_one(lines, lambda i, line: "")
    return _one_to_one(lines, lambda i, line: f"worker-{ctx.index}: ")


def ray_worker(lines: list[str], ctx: FileContext) -> Rendered:
    """Ray's driver relaying a remote actor's output (python/ray/_private/worker.py print_worker_logs:
    "{DIM}{CYAN}({actor} pid={pid}, ip={ip}){RESET_ALL} {line}", colorama's codes kept when the driver's output is
    captured)."""
    if ctx.node_log:
        return _one_to_one(lines, lambda i, line: "")
    head = f"\x1b[2m\x1b[36m(RayTrainWorker pid={4100 + ctx.index}, ip=10.0.0.{ctx.index + 2})\x1b[0m "
    return _one_to_one(lines, lambda i, line: head)


def compose_service(lines: list[str], ctx: FileContext) -> Rendered:
    """`docker compose up` / `docker compose logs`: the container's name left-aligned to the longest name plus one,
    then "| " (compose's cmd/formatter/logs.go: fmt.Sprintf("%-"+strconv.Itoa(width)+"s | ", name)); uncoloured
    when not written to a terminal."""
    if ctx.node_log:
        return _one_to_one(lines, lambda i, line: "")
    name = f"trainer-{ctx.index + 1}"
    width = len(name) + 1  # the case's names are as long as each other
    return _one_to_one(lines, lambda i, line: f"{name:<{width}s} | ")


def moreutils_ts(lines: list[str], ctx: FileContext) -> Rendered:
    """moreutils' `ts` in a pipe (`python train.py 2>&1 | ts > train.log`): the time in its default format
    "%b %d %H:%M:%S" and a space before each line - no year, no zone, no host."""
    if ctx.node_log:
        return _one_to_one(lines, lambda i, line: "")

    def head(i: int, line: str) -> str:
        moment = datetime.fromtimestamp(ctx.times[i], tz=UTC)
        return f"{_SHORT_MONTH[moment.month - 1]} {moment.day:02d} {moment:%H:%M:%S} "

    return _one_to_one(lines, head)


def utf8_bom(lines: list[str], ctx: FileContext) -> Rendered:
    """A file saved by a Windows tool that writes UTF-8 with a byte order mark (PowerShell's Set-Content -Encoding
    UTF8, Notepad before Windows 10 1903): U+FEFF before the first line."""
    out, mapping = _one_to_one(lines, lambda i, line: "")
    if out:
        out[0] = "\ufeff" + out[0]
    return out, mapping


PANE_COLUMNS = 80  # tmux's default-size for a session started detached (tmux new -d): 80x24


def tmux_capture(lines: list[str], ctx: FileContext) -> Rendered:
    """A log saved from a terminal multiplexer's scrollback (`tmux capture-pane -p -S -` without -J): a line longer
    than the pane is written as the pane showed it, cut every ``PANE_COLUMNS`` characters into lines of their own.
    The root follows to the first of its pieces; every piece is the same line (``also`` in :func:`render_case`)."""
    out: list[str] = []
    mapping: dict[int, int] = {}
    for n, line in enumerate(lines, 1):
        mapping[n] = len(out) + 1
        pieces = [line[k:k + PANE_COLUMNS] for k in range(0, len(line), PANE_COLUMNS)] or [""]
        out.extend(piece + "\n" for piece in pieces)
    return out, mapping


def markdown_quote(lines: list[str], ctx: FileContext) -> Rendered:
    """A log taken from the Markdown source of an issue or a mail where it was quoted: the block quote marker and its
    space before every line (CommonMark 0.31, 5.1 Block quotes: ">" and an optional space), whatever wrote it."""
    return _one_to_one(lines, lambda i, line: "> " if line else ">")


def markdown_indent(lines: list[str], ctx: FileContext) -> Rendered:
    """A log taken from the Markdown source of an issue where it was pasted as an indented code block: four spaces
    before every line (CommonMark 0.31, 4.4 Indented code blocks; a blank line inside stays blank)."""
    return _one_to_one(lines, lambda i, line: "    " if line else "")


# A line that goes to stderr: the level field of a logging formatter at WARN or above (Python's logging.lastResort and
# most trainers' handlers write these to stderr), a line of a Python traceback - its header, the indented frames and
# the exception line that ends it (the interpreter's excepthook prints to sys.stderr). A relay's prefix ("[rank4]: ")
# is read past. Every other line goes to stdout: a report printed line by line (torchelastic's ChildFailedError
# summary, an unprefixed exception line) is split as a line classifier splits it, not as its writer would.
_STDERR_LEVEL = re.compile(r"\b(?:WARNING|WARN|ERROR|CRITICAL|FATAL)\b")


def stdout_stderr(lines: list[str], ctx: FileContext) -> Rendered | Streams:
    """A job's stdout and stderr written to files of their own (Slurm's `sbatch --output=<name>.out --error=<name>.err`,
    a container's two streams saved apart where `kubectl logs` gives one): each line to the stream its writer would
    use - tracebacks and WARN / ERROR lines to stderr, the rest to stdout - so the order between the two is lost.
    A kernel log is no process's output and stays as it is."""
    if ctx.node_log:
        return _one_to_one(lines, lambda i, line: "")
    streams: Streams = {".out": ([], {}), ".err": ([], {})}
    in_traceback = False
    for n, line in enumerate(lines, 1):
        prefix = split_prefix(line)
        text = line if prefix is None else prefix.payload
        if text.strip() == "Traceback (most recent call last):":
            in_traceback, stderr = True, True
        elif in_traceback:
            stderr = True
            in_traceback = text[:1].isspace() or not text.strip()  # the first unindented line ends it
        else:
            stderr = _STDERR_LEVEL.search(text, 0, LEVEL_HEAD) is not None
        out, mapping = streams[".err" if stderr else ".out"]
        out.append(line + "\n")
        mapping[n] = len(out)
    return streams


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
    "mpirun_tag_output": mpirun_tag_output,
    "pdsh_host": pdsh_host,
    "ray_worker": ray_worker,
    "compose_service": compose_service,
    "moreutils_ts": moreutils_ts,
    "utf8_bom": utf8_bom,
    "tmux_capture": tmux_capture,
    "markdown_quote": markdown_quote,
    "markdown_indent": markdown_indent,
    "stdout_stderr": stdout_stderr,
}
# Transforms that cut a line into several: every piece of the root line is the root line.
SPLITS_LINES = frozenset({tmux_capture})


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
    lengths: dict[str, int] = {}
    moved: dict[str, dict[int, str]] = {}  # a file split into streams: where each of its lines went
    for index, path in enumerate(files):
        lines = texts[path]
        name = path.relative_to(case.directory).as_posix()
        ctx = FileContext(index=index, node_log=classify(path, case.directory).kind == "node",
                          times=_file_times(lines, unstamped_start))
        rendered = transform(lines, ctx)
        if isinstance(rendered, dict):
            outputs = {(Path(name).with_suffix(suffix) if Path(name).suffix else Path(name + suffix)).as_posix():
                       stream for suffix, stream in rendered.items()}
            moved[name] = {n: new for new, (_, mapping) in outputs.items() for n in mapping}
        else:
            outputs = {name: rendered}
        for new, (out, maps[new]) in outputs.items():
            if new in lengths:
                raise ValueError(f"{case.id}: {new} rendered twice")
            lengths[new] = len(out)
            target = into / new
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("w", encoding="utf-8", newline="") as handle:
                handle.write("".join(out))
    root_file = moved.get(case.root_file, {}).get(case.root_line, case.root_file)
    root_map = maps[root_file]
    also = [root_map[n] for n in case.also_lines if n in root_map]  # the root's other lines in its stream
    if transform in SPLITS_LINES:
        ends = {n: root_map.get(n + 1, lengths[root_file] + 1) for n in (case.root_line, *case.also_lines)}
        also += [k for n, end in ends.items() for k in range(root_map[n] + 1, end)]
    return dataclasses.replace(case, directory=into, root_file=root_file, root_line=root_map[case.root_line],
                               also_lines=tuple(also))


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
