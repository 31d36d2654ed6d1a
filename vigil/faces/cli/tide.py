"""`vigil tide plan`: how many GPUs spot training and offline inference may hold over the coming intervals,
from an inference request trace and the tier policy."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from vigil.faces.cli.output import DataTable, SafeConsole, json_text
from vigil.model import VigilInputError

if TYPE_CHECKING:
    import numpy as np

    from vigil.model import Action
    from vigil.remedy.tide.planner import TidePlan
    from vigil.remedy.tide.tiers import TierPolicy

app = typer.Typer(
    help="Tidal planning: lend serving capacity to spot training and offline inference.", no_args_is_help=True
)
console = SafeConsole()
err_console = SafeConsole(stderr=True)


TraceOption = Annotated[Path | None, typer.Option("--trace", help="request trace CSV with a TIMESTAMP column")]
PromqlOption = Annotated[
    str | None, typer.Option("--promql", help="Prometheus-compatible API URL to read the serving load from")
]
QueryOption = Annotated[
    str, typer.Option("--query", help="PromQL: the serving request rate as one series")
]
AtOption = Annotated[float | None, typer.Option("--at", help="plan from this time (epoch s; default now)")]
LookbackOption = Annotated[str, typer.Option("--lookback", help="load history read from Prometheus (e.g. 2d)")]
DEFAULT_QUERY = "sum(rate(vllm:request_success_total[10s]))"


def _history(trace: Path | None, promql: str | None, query: str, at: float | None, lookback: str,
             interval_s: float) -> np.ndarray:
    """Per-interval peak request rates from a trace file or from Prometheus (exactly one of them)."""
    import time

    from vigil.remedy.jobspec import parse_duration
    from vigil.remedy.tide.load import peak_rates, peak_rates_from_prometheus, read_request_times

    if (trace is None) == (promql is None):
        raise VigilInputError("give either --trace or --promql (the serving load's source), not both or neither")
    if trace is not None:
        return peak_rates(read_request_times(trace), interval_s)
    from vigil.sources.promql import PromQLSource

    assert promql is not None
    intervals = int(parse_duration(lookback) // interval_s)
    source = PromQLSource(promql)
    try:
        end = time.time() if at is None else at
        return peak_rates_from_prometheus(source, query, end - end % interval_s, intervals, interval_s)
    finally:
        source.close()
GpusOption = Annotated[int, typer.Option("--gpus", min=1, help="GPUs in the cluster")]
UnhealthyOption = Annotated[
    int, typer.Option("--unhealthy-gpus", min=0, help="GPUs on nodes below healthy: never offered")
]
FromStoreOption = Annotated[
    bool, typer.Option("--from-store", help="take the GPUs and the nodes below healthy from the store's topology")
]
PolicyOption = Annotated[Path | None, typer.Option("--policy", help="tier policy YAML (default: the shipped one)")]
HorizonOption = Annotated[int | None, typer.Option("--horizon", min=1, help="intervals to plan")]


def _plan(history: np.ndarray, gpus: int, unhealthy_gpus: int, from_store: bool, tiers: TierPolicy,
          horizon: int | None) -> TidePlan:
    from vigil.remedy.tide.planner import Capacity, capacity_of, plan

    if unhealthy_gpus > gpus:
        raise VigilInputError(f"--unhealthy-gpus {unhealthy_gpus} exceeds --gpus {gpus}")
    capacity = Capacity(gpus, unhealthy_gpus)
    if from_store:
        from vigil.config import settings
        from vigil.store.sql import open_store, store_exists

        if not store_exists(settings().database_url()):
            raise VigilInputError(f"nothing stored under {settings().home}: run `vigil demo` or `vigil serve` first")
        store = open_store()
        try:
            topology, health = store.topology(), store.node_health()
        finally:
            store.close()
        if topology is None or not any(node.gpus for node in topology.nodes):
            raise VigilInputError("the stored topology has no GPUs")
        capacity = capacity_of(topology, health)
    return plan(history, tiers, capacity, horizon)


@app.command("plan")
def plan_command(
    trace: TraceOption = None,
    promql: PromqlOption = None,
    query: QueryOption = DEFAULT_QUERY,
    at: AtOption = None,
    lookback: LookbackOption = "2d",
    gpus: GpusOption = 1000,
    unhealthy_gpus: UnhealthyOption = 0,
    from_store: FromStoreOption = False,
    policy: PolicyOption = None,
    horizon: HorizonOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Forecast the inference load (a trace or PromQL) and allot each tier its GPUs per interval, with preemption
    notices."""
    from vigil.remedy.tide.tiers import load_tier_policy

    tiers = load_tier_policy(policy)
    history = _history(trace, promql, query, at, lookback, tiers.interval_s)
    result = _plan(history, gpus, unhealthy_gpus, from_store, tiers, horizon)
    if as_json:
        typer.echo(json_text(result.as_dict(), indent=2))
        return
    table = DataTable(title=f"Tidal plan: {result.healthy_gpus} healthy GPUs, {tiers.interval_s:g} s intervals")
    for column in ("starts in", "forecast req/s", "1 inference", "2 training", "3 spot", "4 offline"):
        table.add_column(column, justify="right")
    for row in result.intervals:
        table.add_row(
            f"{row.start_s:g} s",
            f"{row.forecast_rps:.1f}",
            f"{row.tiers[1]}" + (f" (short {row.shortfall})" if row.shortfall else ""),
            *(str(row.tiers[n]) for n in (2, 3, 4)),
        )
    console.print(table)
    for notice in result.notices:
        console.print(
            f"notice at +{notice.issued_s:g} s: tier {notice.tier} gives back {notice.gpus} GPUs"
            f" by +{notice.effective_s:g} s"
        )


@app.command("slurm-qos")
def slurm_qos_command(
    policy: PolicyOption = None,
    tres: Annotated[str, typer.Option("--tres", help="the trackable resource a tier's ceiling bounds")] = "gres/gpu",
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """The Slurm QOS for the tiers (sacctmgr command lines) and the slurm.conf lines preemption by QOS needs."""
    from vigil.remedy.tide.slurm import SLURM_CONF_LINES, qos_commands
    from vigil.remedy.tide.tiers import load_tier_policy

    commands = qos_commands(load_tier_policy(policy), tres)
    if as_json:
        typer.echo(json_text({"slurm_conf": list(SLURM_CONF_LINES), "sacctmgr": commands}, indent=2))
        return
    typer.echo("# slurm.conf")
    for line in SLURM_CONF_LINES:
        typer.echo(line)
    typer.echo("# QOS, one per tier")
    for argv in commands:
        typer.echo(" ".join(argv))


@app.command("apply")
def apply_command(
    trace: TraceOption = None,
    promql: PromqlOption = None,
    query: QueryOption = DEFAULT_QUERY,
    lookback: LookbackOption = "2d",
    gpus: GpusOption = 1000,
    unhealthy_gpus: UnhealthyOption = 0,
    from_store: FromStoreOption = False,
    policy: PolicyOption = None,
    backend: Annotated[str, typer.Option("--backend", help="slurm or kubernetes (Kueue)")] = "slurm",
    cluster: Annotated[str, typer.Option("--cluster", help="the cluster's name in audit records")] = "vigil",
    resource: Annotated[
        str | None,
        typer.Option("--resource", help="what tiers are counted in (default: gres/gpu on Slurm, nvidia.com/gpu)"),
    ] = None,
    execute: Annotated[bool, typer.Option("--execute", help="act for real (default: dry-run)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the resulting actions as JSON")] = False,
) -> None:
    """Carry out this interval of the tidal plan: tier quotas, preemption notices, preemptions (dry-run unless
    --execute). Run it once an interval; notices given earlier are read back from the audit log."""
    import time

    from vigil.config import settings
    from vigil.model import ActionKind, ActionStatus
    from vigil.remedy.actuators.base import Actuator, OutboxActuator
    from vigil.remedy.audit import AuditLog
    from vigil.remedy.lease import lease_of
    from vigil.remedy.remediator import Remediator
    from vigil.remedy.tide.act import TierJob, given_notices, tide_actions
    from vigil.remedy.tide.tiers import load_tier_policy

    tiers = load_tier_policy(policy)
    dry_run = not (execute or settings().execute_actions)
    actuator: Actuator
    waiting: list[TierJob] = []
    if backend == "slurm":
        from vigil.remedy.actuators.slurm import SlurmActuator
        from vigil.remedy.tide.slurm import SlurmJobsUnreadable, qos_names, running_tier_jobs

        resource = resource or "gres/gpu"
        try:
            jobs = running_tier_jobs(tiers, resource)
        except SlurmJobsUnreadable as err:
            if not dry_run:
                raise
            # Quotas come from the plan alone; only the notices need to know which jobs run. A dry run on a
            # machine without the Slurm client still shows them, and says what it left out.
            jobs = []
            err_console.print(f"[yellow]{escape(str(err))}: dry-run without the running jobs - the tier quotas are "
                              "complete, preemption notices and preemptions need squeue (run on a Slurm login "
                              "node for them)[/]")
        actuator, queues = SlurmActuator(), qos_names(tiers)
    elif backend == "kubernetes":
        from vigil.remedy.actuators.kueue import KueueActuator
        from vigil.remedy.tide.kube import GPU_RESOURCE, admitted_tier_jobs, cluster_queues

        resource = resource or GPU_RESOURCE
        from vigil.remedy.actuators.base import ActuatorError

        kueue = KueueActuator()
        try:
            workloads = kueue.workloads()
        except ActuatorError as err:
            raise VigilInputError(f"cannot list Kueue workloads: {err}") from None
        actuator, queues, jobs = kueue, cluster_queues(tiers), admitted_tier_jobs(workloads, tiers, resource)
        # resumed only if Vigil's last word on it was a preemption: a Workload someone else deactivated stays
        last: dict[str, ActionKind] = {}
        for earlier in AuditLog().actions(status=ActionStatus.EXECUTED):
            if earlier.params.get("actuator") == "kueue" and earlier.kind in (ActionKind.PREEMPT,
                                                                                ActionKind.RESTART_JOB):
                last[earlier.target] = earlier.kind
        preempted_by_vigil = {target for target, kind in last.items() if kind is ActionKind.PREEMPT}
        waiting = [j for j in admitted_tier_jobs(workloads, tiers, resource, inactive=True)
                   if f"job/{j.id}" in preempted_by_vigil]
    else:
        raise VigilInputError(f"--backend must be slurm or kubernetes, got {backend!r}")
    history = _history(trace, promql, query, None, lookback, tiers.interval_s)
    result = _plan(history, gpus, unhealthy_gpus, from_store, tiers, None)
    audit = AuditLog()
    now = time.time()
    notices = given_notices(audit.actions(kind=ActionKind.PREEMPT_NOTICE, since=now - 7 * 86400))
    actions = tide_actions(result, tiers, jobs, notices, now, cluster=cluster, queues=queues, resource=resource,
                           waiting=waiting)
    remediator = Remediator([OutboxActuator(settings().home / "outbox.jsonl"), actuator], audit,
                            dry_run=dry_run, requested_by="vigil-tide", **lease_of(settings()))
    done = remediator.execute_all(actions)
    if as_json:
        typer.echo(json_text([a.model_dump(mode="json") for a in done], indent=2))
        return
    table = DataTable(title=f"Tidal actions ({'dry-run' if remediator.dry_run else 'executed'})")
    for column in ("action", "target", "status", "result"):
        table.add_column(column)
    for action in done:
        table.add_row(action.kind.value, action.target, action.status.value, action.result)
    console.print(table)


@app.command("kube-setup")
def kube_setup_command(
    namespace: Annotated[list[str], typer.Option("--namespace", help="a namespace that gets the tiers' LocalQueues")],
    policy: PolicyOption = None,
    execute: Annotated[bool, typer.Option("--execute", help="create them (default: print the manifests)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """The tiers' PriorityClasses and Kueue ResourceFlavor, ClusterQueues and LocalQueues: printed, or created
    through the Kubernetes API with --execute (an object that exists is left as it is)."""
    import yaml

    from vigil.remedy.tide.kube import kueue_objects, priority_classes
    from vigil.remedy.tide.tiers import load_tier_policy

    tiers = load_tier_policy(policy)
    objects = priority_classes(tiers) + kueue_objects(tiers, namespace)
    if not execute:
        typer.echo(json_text(objects, indent=2) if as_json else yaml.safe_dump_all(objects, sort_keys=False))
        return
    from vigil.remedy.actuators.base import ActuatorError
    from vigil.remedy.actuators.kueue import KueueActuator

    try:
        results = KueueActuator().ensure(objects)
    except ActuatorError as err:
        raise VigilInputError(str(err)) from None
    typer.echo(json_text(results, indent=2) if as_json else "\n".join(results))


@app.command("rl")
def rl_command(
    trace: Annotated[Path, typer.Option("--trace", help="trace CSV with a GeneratedTokens column (lengths)")],
    gpus: Annotated[int, typer.Option("--gpus", min=16, help="GPUs of the RL job")] = 64,
    batch: Annotated[int, typer.Option("--batch", min=1, help="sequences trained on per step")] = 8192,
    gpu_tokens_s: Annotated[float, typer.Option("--gpu-tokens-s", min=1, help="decode tokens/s of one GPU")] = 2500,
    seq_tokens_s: Annotated[float, typer.Option("--seq-tokens-s", min=1, help="decode tokens/s of one sequence")] = 40,
    train_tokens_gpu_s: Annotated[
        float, typer.Option("--train-tokens-gpu-s", min=1, help="training tokens/s per GPU")
    ] = 1000,
    switch_s: Annotated[float, typer.Option("--switch-s", min=0, help="co-located switch, each way")] = 5,
    weight_sync_s: Annotated[float, typer.Option("--weight-sync-s", min=0, help="separated weight sync")] = 5,
    backend: Annotated[str, typer.Option("--backend", help="none, slurm or kubernetes: set the RL queues' quotas")]
    = "none",
    execute: Annotated[bool, typer.Option("--execute", help="act for real (default: dry-run)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Plan RL train / inference placement: separated, co-located with switching, co-located with partial rollout,
    from the trace's generation lengths; the chosen plan's GPUs per RL queue go to the scheduler with --backend."""
    from vigil.remedy.tide.load import read_generation_lengths
    from vigil.remedy.tide.rl import RlCluster, plan_rl

    if backend not in ("none", "slurm", "kubernetes"):
        raise VigilInputError(f"--backend must be none, slurm or kubernetes, got {backend!r}")
    cluster = RlCluster(gpus=gpus, batch=batch, gpu_tokens_s=gpu_tokens_s, seq_tokens_s=seq_tokens_s,
                        train_tokens_gpu_s=train_tokens_gpu_s, switch_s=switch_s, weight_sync_s=weight_sync_s)
    result = plan_rl(read_generation_lengths(trace), cluster)
    actions = _rl_quota_actions(result.quotas(), backend, execute)
    if as_json:
        typer.echo(json_text(result.as_dict() | {"actions": [a.model_dump(mode="json") for a in actions]}, indent=2))
        return
    table = DataTable(title=f"RL step on {gpus} GPUs, {batch} sequences a step (chosen: {result.chosen.mode})")
    # at 80 columns a name or a number folds onto the next line instead of ending in an ellipsis
    for column in ("deployment", "step s", "rollout s", "train s", "switch/sync s", "GPU idle", "tail s",
                   "staleness", "samples/h"):
        table.add_column(column, justify="left" if column == "deployment" else "right", overflow="fold")
    for stats in (result.separated, result.colocated, result.partial):
        name = stats.mode + (f" ({stats.rollout_gpus} generate)" if stats.mode == "separated" else "") + (
            f" (+{stats.over_provision:.0%})" if stats.mode == "partial" else "")
        table.add_row(name, f"{stats.step_s:.1f}", f"{stats.rollout_s:.1f}", f"{stats.train_s:.1f}",
                      f"{stats.overhead_s:.1f}", f"{stats.idle_fraction:.1%}", f"{stats.tail_s:.1f}",
                      f"{stats.staleness:.2f}", f"{stats.samples_per_hour:,.0f}")
    console.print(table)
    for action in actions:
        console.print(f"{action.kind.value} {action.params['queue']}={action.params['units']}: {action.status.value}"
                      f" - {action.result}")


def _rl_quota_actions(quotas: dict[str, int], backend: str, execute: bool) -> list[Action]:
    """The RL queues' quotas through the remediator (audited; dry-run unless --execute)."""
    import time

    from vigil.config import settings
    from vigil.model import Action, ActionKind
    from vigil.remedy.actuators.base import Actuator
    from vigil.remedy.audit import AuditLog
    from vigil.remedy.lease import lease_of
    from vigil.remedy.remediator import Remediator

    if backend == "none":
        return []
    actuator: Actuator
    if backend == "slurm":
        from vigil.remedy.actuators.slurm import SlurmActuator

        actuator, resource = SlurmActuator(), "gres/gpu"
    elif backend == "kubernetes":
        from vigil.remedy.actuators.kueue import GPU_RESOURCE, KueueActuator

        actuator, resource = KueueActuator(), GPU_RESOURCE
    else:
        raise VigilInputError(f"--backend must be none, slurm or kubernetes, got {backend!r}")
    actions = [Action(ts=time.time(), kind=ActionKind.SET_QUOTA, target="cluster/vigil", requested_by="vigil-tide",
                      reason=f"RL plan: {queue} holds {units} GPUs",
                      params={"queue": queue, "resource": resource, "units": units})
               for queue, units in quotas.items()]
    remediator = Remediator([actuator], AuditLog(), dry_run=not (execute or settings().execute_actions),
                            requested_by="vigil-tide", **lease_of(settings()))
    return remediator.execute_all(actions)
