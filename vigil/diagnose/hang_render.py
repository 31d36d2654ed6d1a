"""A short human summary of a diagnosis (Rich). Summaries, log lines and frames are data: escaped, never
read as markup (a torch log line starts with ``[rank0]:``)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from vigil.diagnose.hang import HangDiagnosis
from vigil.diagnose.stacks import merge_stacks

_STYLE = {"ok": "green", "slow": "yellow", "hang": "red", "crash": "red", "mismatch": "red"}


def print_diagnosis(diagnosis: HangDiagnosis, console: Console) -> None:
    style = _STYLE.get(diagnosis.verdict, "white")
    console.print(f"[bold {style}]{escape(diagnosis.verdict.upper())}[/] {escape(diagnosis.summary)}",
                  highlight=False)
    if diagnosis.culprit_ranks:
        kind = f"  kind: {diagnosis.hang_kind}" if diagnosis.hang_kind else ""
        console.print(f"culprit rank(s): {diagnosis.culprit_ranks}{kind}", markup=False)
    if diagnosis.culprit_links:
        console.print(f"culprit link(s): {diagnosis.culprit_links}", markup=False)
    if diagnosis.root_error:
        console.print(f"root error: {diagnosis.root_error}", highlight=False, markup=False)
    if diagnosis.fork_point:
        fork = diagnosis.fork_point
        console.print(
            f"fork point ({fork.thread}): after {fork.parent}, ranks {fork.ranks} go to "
            f"{fork.frame} while ranks {fork.majority_ranks} go to {fork.majority_frame}",
            highlight=False,
            markup=False,
        )
    if diagnosis.detected_after_s is not None:
        console.print(f"detected {diagnosis.detected_after_s:.1f} s after the job's last progress")
    if diagnosis.stacks and diagnosis.verdict in ("hang", "mismatch"):
        tree = merge_stacks({rank: {"MainThread": frames} for rank, frames in diagnosis.stacks.items()})
        console.print(f"merged main-thread stacks ({diagnosis.stack_source}):", markup=False)
        console.print(tree.render(max_depth=30), highlight=False, markup=False)
    if diagnosis.ranks:
        table = Table("rank", "state", "op", "heartbeat age (s)", "step (ms)", "comm wait (ms)", "top frame")
        for row in diagnosis.ranks:
            mark = Text("*", style="bold red") if row.rank in diagnosis.culprit_ranks else ""
            age = "" if row.heartbeat_age_s is None else f"{row.heartbeat_age_s:.1f}"
            step = "" if row.median_step_s is None else f"{row.median_step_s * 1000:.0f}"
            wait = "" if row.mean_comm_wait_s is None else f"{row.mean_comm_wait_s * 1000:.1f}"
            table.add_row(Text.assemble(str(row.rank), mark), Text(row.state), Text(row.op or ""), age, step, wait,
                          Text(row.top_frame or ""))
        console.print(table)
