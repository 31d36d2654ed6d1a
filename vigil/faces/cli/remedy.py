"""`vigil remedy ...`: policies, planning and acting on anomalies, the audit log, node lifecycle."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, get_args

import typer
from rich.text import Text

from vigil.config import RemedyBackend
from vigil.faces.cli.output import DataTable, SafeConsole, json_text
from vigil.faces.verdicts import audit_texts
from vigil.model import Action, ActionKind, ActionStatus, Anomaly, Topology, VigilInputError, parse_entity

if TYPE_CHECKING:
    from vigil.remedy.remediator import Remediator

app = typer.Typer(
    help="Remediation: policies, actions (dry-run by default), audit log, node lifecycle.", no_args_is_help=True
)
console = SafeConsole()


@app.command("policies")
def policies_command(
    path: Annotated[Path | None, typer.Argument(help="policy YAML (default: the built-in policies)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the validated policies as JSON")] = False,
) -> None:
    """Validate a policy file and show which faults lead to which actions."""
    from vigil.remedy.policy import load_policies

    policies = load_policies(path)
    if as_json:
        typer.echo(policies.model_dump_json(indent=2, by_alias=True))
        return
    table = DataTable(title=f"Policies ({path or 'built-in'}), first match wins")
    for column in ("policy", "match", "actions", "cooldown", "escalation"):
        table.add_column(column)
    for policy in policies.policies:
        match = policy.match
        parts = [
            f"level>={match.min_level.label}" if match.min_level is not None else "",
            f"level<={match.max_level.label}" if match.max_level is not None else "",
            "types " + ",".join(match.fault_types) if match.fault_types else "",
            "on " + ",".join(match.entity_kinds) if match.entity_kinds else "",
        ]
        cooldown = policy.cooldown_s if policy.cooldown_s is not None else policies.defaults.cooldown_s
        escalation = "; ".join(
            f"{s.after}x/{s.within_s:g}s -> {','.join(a.value for a in s.actions)}" for s in policy.escalation
        )
        table.add_row(
            policy.name,
            " ".join(p for p in parts if p) or "any",
            ", ".join(a.value for a in policy.actions),
            f"{cooldown:g}s",
            escalation,
        )
    console.print(table)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _read_topology(path: Path) -> Topology:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise VigilInputError(f"topology file {path} does not exist") from None
    except OSError as err:
        raise VigilInputError(f"topology file {path} cannot be read: {err.strerror or err}") from None
    try:
        return Topology.from_json(raw)
    except VigilInputError as err:
        raise VigilInputError(f"topology file {path}: {err}") from None


def _read_anomalies(path: Path) -> list[Anomaly]:
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except FileNotFoundError:
        raise VigilInputError(f"anomaly file {path} does not exist") from None
    except UnicodeDecodeError:
        raise VigilInputError(f"anomaly file {path} is not UTF-8 text (one Anomaly JSON record per line)") from None
    except OSError as err:
        raise VigilInputError(f"anomaly file {path} cannot be read: {err.strerror or err}") from None
    anomalies = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            anomalies.append(Anomaly.from_json(line))
        except VigilInputError as err:
            raise VigilInputError(f"{path}:{number}: {err}") from None
    return anomalies


# options shared by the verbs that act
BACKENDS: tuple[str, ...] = get_args(RemedyBackend)
BackendOption = Annotated[
    str | None, typer.Option("--backend", help="none, kubernetes or slurm (default: settings remedy_backend, "
                             "VIGIL_REMEDY_BACKEND, else none)")
]
ExecuteOption = Annotated[bool, typer.Option("--execute", help="act for real (default: dry-run)")]
LocalNodeOption = Annotated[
    str | None, typer.Option("--local-node", help="this machine's node name: reset its GPUs with nvidia-smi")
]


@app.command("apply")
def apply_command(
    anomalies: Annotated[Path, typer.Argument(help="anomalies, one Anomaly JSON record per line")],
    policies: Annotated[Path | None, typer.Option("--policies", help="policy YAML")] = None,
    topology: Annotated[
        Path | None, typer.Option("--topology", help="Topology JSON (for the blast-radius guard)")
    ] = None,
    backend: BackendOption = None,
    execute: ExecuteOption = False,
    local_node: LocalNodeOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the resulting actions as JSON")] = False,
) -> None:
    """Plan actions for anomalies with the policies and carry them out (dry-run unless --execute)."""
    from vigil.remedy.policy import PolicyEngine, load_policies

    remediator = _remediator(topology, _backend(backend), execute, local_node)
    dry_run = remediator.dry_run
    engine = PolicyEngine(load_policies(policies))
    actions = []
    for anomaly in _read_anomalies(anomalies):
        actions.extend(remediator.handle(anomaly, engine))
    if as_json:
        typer.echo(json_text([a.model_dump(mode="json") for a in actions], indent=2))
        return
    _print_actions(actions, f"Actions ({'dry-run' if dry_run else 'executed'})")


def _backend(given: str | None) -> str:
    """The scheduler to act through: --backend, else the configured ``remedy_backend`` (VIGIL_REMEDY_BACKEND)."""
    from vigil.config import settings

    backend = given if given is not None else settings().remedy_backend
    if backend not in BACKENDS:
        raise VigilInputError(f"--backend must be {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]}, got {backend!r}")
    return backend


def _backends_for(action: Action) -> list[str]:
    """The schedulers whose actuator carries out ``action`` (read from the actuators' declared kinds)."""
    from vigil.remedy.actuators.kubernetes import KubernetesActuator
    from vigil.remedy.actuators.slurm import SlurmActuator

    target_kind = parse_entity(action.target)[0]
    return [name for name, actuator in (("kubernetes", KubernetesActuator), ("slurm", SlurmActuator))
            if action.kind in actuator.kinds and target_kind in actuator.target_kinds]


def _remediator(topology: Path | None, backend: str, execute: bool, local_node: str | None) -> Remediator:
    """The remedy engine the CLI verbs share: actuators for the backend, guard, lifecycle, audit, dry-run."""
    from vigil.config import settings
    from vigil.remedy.acting import scheduler_actuator
    from vigil.remedy.actuators.base import Actuator, OutboxActuator
    from vigil.remedy.audit import AuditLog
    from vigil.remedy.guard import BlastRadiusGuard
    from vigil.remedy.lease import lease_of
    from vigil.remedy.lifecycle import LifecycleStore
    from vigil.remedy.remediator import Remediator

    dry_run = not (execute or settings().execute_actions)
    if not dry_run and topology is None:
        raise VigilInputError("--execute needs --topology: the blast-radius guard must know the cluster")
    actuators: list[Actuator] = [OutboxActuator(settings().home / "outbox.jsonl")]
    scheduler = scheduler_actuator(backend)
    if scheduler is not None:
        actuators.append(scheduler)
    if local_node:
        from vigil.remedy.actuators.nvidia import GpuResetActuator

        actuators.append(GpuResetActuator(local_node))
    lifecycle = LifecycleStore()
    guard = None
    if topology is not None:
        cluster = _read_topology(topology)
        guard = BlastRadiusGuard(
            cluster,
            lifecycle,
            max_share=settings().max_cordon_share,
            max_share_per_switch=settings().max_cordon_share_per_switch,
        )
    remediator = Remediator(
        actuators, AuditLog(), lifecycle=lifecycle, guard=guard, dry_run=dry_run, requested_by="vigil-cli",
        **lease_of(settings()),
    )
    return remediator


@app.command("act")
def act_command(
    action: Annotated[str, typer.Argument(help="a whitelisted action: " + ", ".join(k.value for k in ActionKind))],
    target: Annotated[str, typer.Argument(help="entity id, e.g. node/n012, gpu/n012/3, job/j7")],
    incident: Annotated[str | None, typer.Option("--incident", help="the incident this action answers")] = None,
    reason: Annotated[str, typer.Option("--reason", help="why (goes to the audit log)")] = "",
    topology: Annotated[
        Path | None, typer.Option("--topology", help="Topology JSON (default: the store's topology)")
    ] = None,
    backend: BackendOption = None,
    execute: ExecuteOption = False,
    local_node: LocalNodeOption = None,
    bad_nodes: Annotated[list[str] | None, typer.Option(
        "--node", help="migrate_job only: a bad node (node/NAME) to take out and keep the job off; repeatable. "
        "Without it the node --incident is localized to (its diagnosis' root cause) is the bad one, else the "
        "job's nodes already drained / cordoned")] = None,
    queue: Annotated[str | None, typer.Option(
        "--queue", help="set_quota only: the queue whose quota is set (a Kueue ClusterQueue, a Slurm QOS)")] = None,
    resource: Annotated[str | None, typer.Option(
        "--resource", help="set_quota only: what the quota counts (default nvidia.com/gpu on Kubernetes, "
        "gres/gpu on Slurm)")] = None,
    quantity: Annotated[str | None, typer.Option(
        "--quantity", help="set_quota only: the quota, a whole count of at least 0 (e.g. 64)")] = None,
    flavor: Annotated[str | None, typer.Option(
        "--flavor", help="set_quota on Kubernetes only: the ResourceFlavor, needed when the ClusterQueue has the "
        "resource in several")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the resulting action as JSON")] = False,
) -> None:
    """Carry out one action of a diagnosis plan through the blast-radius guard and the audit log.

    The plans `vigil diagnose incident` prints carry this command without --backend: it acts through the
    configured scheduler (settings remedy_backend, VIGIL_REMEDY_BACKEND), and is a dry-run unless --execute.
    set_quota takes its queue and quantity from --queue and --quantity (and --resource, --flavor).
    """
    import time

    from vigil.model import node_of
    from vigil.remedy.actuators.base import ActuatorError

    try:
        kind = ActionKind(action)
    except ValueError:
        raise VigilInputError(
            f"action {action!r} is not on the whitelist ({', '.join(k.value for k in ActionKind)})"
        ) from None
    parse_entity(target)
    params: dict[str, object] = {"nodes": _bad_nodes(kind, bad_nodes)} if bad_nodes else {}
    params.update(_quota_params(kind, queue, resource, quantity, flavor))
    if kind is ActionKind.MIGRATE_JOB and not bad_nodes and incident is not None:
        localized = _incident_nodes(incident)
        if localized:
            params = {"nodes": localized, "nodes_from": f"incident {incident}"}
    chosen = _backend(backend)
    topology_file = topology or _store_topology_file()
    remediator = _remediator(topology_file, chosen, execute, local_node)
    proposed = Action(ts=time.time(), kind=kind, target=target, incident_id=incident, reason=reason,
                      requested_by="vigil-cli", dry_run=remediator.dry_run, params=params)
    # Checked before anything is audited: an action nobody can carry out, or on a machine the cluster does
    # not have, is a mistake in the command line (or the settings), not a refusal to record.
    actuator = remediator.actuator_for(proposed)
    if actuator is None:
        raise VigilInputError(_no_actuator(proposed, chosen, given=backend is not None))
    try:
        actuator.describe(proposed)  # reads only the action: a target this back end cannot name is a typo
    except ActuatorError as err:
        raise VigilInputError(f"{kind.value} {target}: {err}") from None
    problem = getattr(actuator, "quota_problem", None)
    if kind is ActionKind.SET_QUOTA and problem is not None and (found := problem(proposed)) is not None:
        raise VigilInputError(f"{kind.value} {target}: {found}")  # no such queue / resource / flavor
    nodes = [n for n in [node_of(target), *_as_list(params.get("nodes"))] if n is not None]
    if topology_file is not None and nodes:
        known = {n.id for n in _read_topology(topology_file).nodes}
        for node in nodes:
            if node not in known:
                raise VigilInputError(f"{node} is not in the topology ({topology_file}); check the node name")
    # what was decided on the incident before this action (every record of its runs: verdicts, retries, refusals),
    # read first so that this action's own record is not among them
    earlier = remediator.audit.actions(incident=incident) if incident is not None else []
    done = remediator.execute(proposed)
    if as_json:
        shown: dict[str, object] = done.model_dump(mode="json")
        if incident is not None:
            shown["earlier_actions"] = [{**a.model_dump(mode="json"), "verdict": said}
                                        for a, said in zip(earlier, audit_texts(earlier), strict=True)]
        typer.echo(json_text(shown, indent=2))
    else:
        _print_actions([done], f"Action ({'dry-run' if remediator.dry_run else 'executed'})")
        if earlier:
            _print_actions(earlier, f"Earlier actions on incident {incident} (oldest first)")
        elif incident is not None:
            console.print(f"no earlier action recorded on incident {incident}")
    if done.status in (ActionStatus.REFUSED, ActionStatus.FAILED):
        raise typer.Exit(1)


def _bad_nodes(kind: ActionKind, given: list[str]) -> list[str]:
    """The --node values, checked: node ids, and only for migrate_job (no other action reads them)."""
    if kind is not ActionKind.MIGRATE_JOB:
        raise VigilInputError(f"--node names the bad nodes of a migrate_job; {kind.value} does not take it")
    for node in given:
        if parse_entity(node)[0] != "node":
            raise VigilInputError(f"--node {node!r}: expected a node id, node/<name>")
    return list(dict.fromkeys(given))


def _quota_params(kind: ActionKind, queue: str | None, resource: str | None, quantity: str | None,
                  flavor: str | None) -> dict[str, object]:
    """set_quota's --queue, --resource, --quantity and --flavor as the action's params, checked here for what
    every back end shares (the back end checks the names); no other action takes them."""
    given = [name for name, value in (("--queue", queue), ("--resource", resource), ("--quantity", quantity),
                                      ("--flavor", flavor)) if value is not None]
    if kind is not ActionKind.SET_QUOTA:
        if given:
            raise VigilInputError(f"{', '.join(given)}: options of set_quota; {kind.value} does not take them")
        return {}
    if queue is None or quantity is None:
        raise VigilInputError("set_quota needs --queue (the ClusterQueue or QOS) and --quantity (a whole count), "
                              "e.g. --queue vigil-spot-training --resource nvidia.com/gpu --quantity 64")
    if not quantity.strip().isdigit() or not quantity.strip().isascii():
        raise VigilInputError(f"--quantity {quantity!r}: a whole count of at least 0, e.g. 64")
    params: dict[str, object] = {"queue": queue, "units": int(quantity.strip())}
    if resource is not None:
        params["resource"] = resource
    if flavor is not None:
        params["flavor"] = flavor
    return params


def _as_list(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _incident_nodes(incident_id: str) -> list[str]:
    """The node an incident is localized to, as migrate_job's bad node: the node of its diagnosis' root cause;
    without a diagnosis naming a GPU, NIC or node, the one node all its GPU / NIC / node entities live on.
    None found (a switch's fault, entities on several nodes): an empty list and a note on stderr."""
    from vigil.model import node_of
    from vigil.store.sql import open_store

    store = open_store()
    found = store.incident(incident_id)
    if found is None:
        raise VigilInputError(f"--incident {incident_id}: no such incident in the store")
    diagnosis = store.diagnosis(incident_id)
    cause = diagnosis.root_cause.entity if diagnosis is not None and diagnosis.root_cause is not None else None
    if cause is not None and (node := node_of(cause)) is not None:
        return [node]
    on = sorted({n for entity in [found.scope, *found.entities] if (n := node_of(entity)) is not None})
    if len(on) == 1:
        return on
    where = f"root cause {cause}" if cause is not None else f"entities on {', '.join(on)}" if on else "no node"
    typer.echo(f"incident {incident_id} is not localized to one node ({where}): the job's drained or cordoned "
               "nodes are the bad ones (name one with --node node/NAME)", err=True)
    return []


def _no_actuator(action: Action, backend: str, given: bool) -> str:
    """One line: why nothing here carries out ``action``, and what would."""
    where = f"--backend {backend}" if given else f"backend {backend!r} (settings remedy_backend)"
    what = f"no actuator handles {action.kind.value} on {action.target} with {where}"
    if action.kind is ActionKind.RESET_GPU:
        return f"{what}; run it on the GPU's node with --local-node NODE"
    able = _backends_for(action)
    if not able:
        return f"{what}; no scheduler backend of `vigil remedy act` carries out {action.kind.value}"
    choices = " or ".join(able)
    return (f"{what}; set VIGIL_REMEDY_BACKEND={'|'.join(able)} (remedy_backend in the config file) "
            f"or pass --backend {choices}")


def _store_topology_file() -> Path | None:
    """The topology the store holds, written where the guard can read it (None when the store has none)."""
    from vigil.config import settings
    from vigil.store.sql import open_store

    topo = open_store().topology()
    if topo is None:
        return None
    path = settings().home / "topology.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(topo.model_dump_json())
    return path


def _print_actions(actions: Sequence[Action], title: str) -> None:
    table = DataTable(title=title)
    table.add_column("time", no_wrap=True)
    table.add_column("action", no_wrap=True)
    table.add_column("target", no_wrap=True, min_width=max((len(a.target) for a in actions), default=6))
    table.add_column("status", no_wrap=True)
    table.add_column("result / reason")
    for action, said in zip(actions, audit_texts(actions), strict=True):
        table.add_row(_when(action.ts), action.kind.value, action.target, action.status.value, Text(said))
    console.print(table)


@app.command("audit")
def audit_command(
    target: Annotated[str | None, typer.Option("--target", help="only actions on this entity")] = None,
    limit: Annotated[int, typer.Option("--limit", help="newest N actions")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="print the actions as JSON")] = False,
) -> None:
    """The audit log: every action proposed, refused, skipped or executed, with who / why / result."""
    from vigil.config import settings
    from vigil.remedy.audit import AuditLog
    from vigil.store.sql import store_exists

    actions = AuditLog().actions(target=target)[-limit:] if store_exists(settings().database_url()) else []
    if as_json:
        typer.echo(json_text([a.model_dump(mode="json") for a in actions], indent=2))
        return
    _print_actions(actions, "Audit log")


@app.command("lifecycle")
def lifecycle_command(
    as_json: Annotated[bool, typer.Option("--json", help="print node states as JSON")] = False,
) -> None:
    """Node lifecycle states (healthy, suspect, cordoned, draining, repairing, self_check, vendor_repair)."""
    from vigil.config import settings
    from vigil.remedy.lifecycle import LifecycleStore
    from vigil.store.sql import store_exists

    nodes = LifecycleStore().all() if store_exists(settings().database_url()) else []
    if as_json:
        typer.echo(
            json_text(
                [
                    {
                        "node": n.node,
                        "state": n.state.value,
                        "since": n.since,
                        "reason": n.reason,
                        "repair_attempts": n.repair_attempts,
                    }
                    for n in nodes
                ],
                indent=2,
            )
        )
        return
    table = DataTable(title="Node lifecycle")
    for column in ("node", "state", "since", "repairs", "reason"):
        table.add_column(column)
    for n in nodes:
        table.add_row(n.node, n.state.value, _when(n.since), str(n.repair_attempts), n.reason)
    console.print(table)


@app.command("self-check")
def self_check_command(
    node: Annotated[str, typer.Argument(help="node id, e.g. node/n012")],
    passed: Annotated[bool, typer.Option("--passed/--failed", help="the self-check result after repair")],
    execute: Annotated[bool, typer.Option("--execute", help="uncordon for real (default: dry-run)")] = False,
) -> None:
    """Close a repair: record the self-check result; a pass returns the node, repeated failures go to the vendor."""
    from vigil.config import settings
    from vigil.remedy.actuators.base import OutboxActuator
    from vigil.remedy.audit import AuditLog
    from vigil.remedy.lease import lease_of
    from vigil.remedy.lifecycle import LifecycleStore
    from vigil.remedy.remediator import Remediator

    remediator = Remediator(
        [OutboxActuator(settings().home / "outbox.jsonl")],
        AuditLog(),
        lifecycle=LifecycleStore(),
        dry_run=not execute,
        requested_by="vigil-cli",
        **lease_of(settings()),
    )
    state = remediator.finish_repair(node, passed, "vigil remedy self-check")
    console.print(f"{node}: {state.value}", markup=False)


def _record_idle_incidents(actions: Sequence[Action]) -> None:
    """A sent notice opens an incident; an executed release step adds its evidence to the notice's incident."""
    from vigil.remedy.idle import POLICY, idle_incident, idle_incident_id
    from vigil.store.sql import open_store

    done = [a for a in actions if a.status is ActionStatus.EXECUTED and a.params.get("policy") == POLICY]
    if not done:
        return
    store = open_store()
    try:
        for action in done:
            store.upsert_incident(idle_incident(action, store.incident(idle_incident_id(action))))
    finally:
        store.close()


@app.command("idle-workers")
def idle_workers_command(
    grace: Annotated[float, typer.Option("--grace", min=1.0, help="seconds from the notice to the release")] = 1800.0,
    min_idle: Annotated[int, typer.Option("--min-idle", min=1, help="idle GPUs that make a job count")] = 1,
    idle_activity: Annotated[
        float, typer.Option("--idle-activity", min=0.0, max=1.0, help="a GPU below this all window is idle")
    ] = 0.05,
    backend: Annotated[str | None, typer.Option(help="none, kubernetes or slurm: what carries out a release "
                                                "(default: settings remedy_backend, else none)")] = None,
    execute: Annotated[bool, typer.Option("--execute", help="notify and release for real (default: dry-run)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the actions as JSON")] = False,
) -> None:
    """The idle-worker policy: notify jobs whose GPUs sat idle, release them after --grace if still idle.

    Reads the stored topology and GPU metrics (a window of twice the grace period up to the last scrape); run
    it at least once per grace period. Every notice and release is an audited action (`vigil remedy audit`),
    and a sent notice opens an incident. A job the --backend scheduler does not run (an interactive or bare
    machine) gets a release request to its owner through the outbox instead of a preemption.
    """
    from vigil.config import settings
    from vigil.detect.waste import gpu_waste
    from vigil.faces.cli.waste import stored_allocation
    from vigil.remedy.actuators.base import Actuator, OutboxActuator
    from vigil.remedy.actuators.release import ReleaseRequestActuator
    from vigil.remedy.audit import AuditLog
    from vigil.remedy.idle import IdleWorkerPolicy, idle_worker_actions
    from vigil.remedy.lease import lease_of
    from vigil.remedy.remediator import Remediator

    home = settings().home
    backend = _backend(backend)
    topology, metrics, span = stored_allocation()
    start, end = max(span[0], span[1] - 2 * grace), span[1]
    report = gpu_waste(metrics, topology, start, max(end, start + 1.0), idle_activity=idle_activity)
    actuators: list[Actuator] = [OutboxActuator(home / "outbox.jsonl"), ReleaseRequestActuator(home / "outbox.jsonl")]
    if backend == "slurm":
        from vigil.remedy.actuators.slurm import SlurmActuator

        actuators.append(SlurmActuator())
    elif backend == "kubernetes":
        from vigil.remedy.actuators.kueue import KueueActuator

        actuators.append(KueueActuator())
    audit = AuditLog()
    remediator = Remediator(actuators, audit, dry_run=not execute, requested_by="idle-policy", **lease_of(settings()))
    # The metrics' clock, not the wall clock: the grace period is measured on the scrapes.
    # Jobs the back end's scheduler did not start (an interactive or bare machine's, a file's) it cannot release.
    bare = {job.id for job in topology.jobs if job.source != backend}
    wanted = idle_worker_actions(report, audit, IdleWorkerPolicy(grace, min_idle), now=end, bare_jobs=bare)
    actions = [remediator.execute(action) for action in wanted]
    _record_idle_incidents(actions)
    if as_json:
        typer.echo(json_text([a.model_dump(mode="json") for a in actions], indent=2))
        return
    _print_actions(actions, f"Idle workers ({'executed' if execute else 'dry-run'}), grace {grace:g} s")
