"""Carries out actions safely: whitelist, idempotence, blast-radius guard, dry-run, audit, lifecycle.

Every action that reaches ``execute`` leaves exactly one audit record, whatever happens to it:
PROPOSED (dry-run: what would have run), EXECUTED, SKIPPED (already done / cooldown), REFUSED
(blast radius, no actuator) or FAILED (the back end said no). An owner whose claim lapsed while the back end
worked, and whose run another process resumed, records the back end's late answer under an id of its own; so does
a repeat of an action whose run another process holds (``params.repeat_of``), and a retry of an action whose
record exists already (a resumed run of it refused, skipped or failed: ``params.retry_of``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence

from vigil.model import (
    Action,
    ActionKind,
    ActionStatus,
    Anomaly,
    Diagnosis,
    new_id,
    node_id,
    node_of,
    parse_entity,
)
from vigil.remedy.actuators.base import Actuator, ActuatorError, migration_nodes, recording
from vigil.remedy.audit import AuditLog, UnfinishedRun
from vigil.remedy.commands import (
    ABANDON_AFTER_KEEP_S,
    KEEP_S,
    CommandJournal,
    abandon_unsettled,
    must_adopt,
    prune_settled,
    settle_left_running,
)
from vigil.remedy.guard import CAPACITY_ACTIONS, BlastRadiusGuard
from vigil.remedy.lease import DEFAULT_LEASE_S, DEFAULT_RENEW_S, Renewal, Wait, wall_wait
from vigil.remedy.lifecycle import LifecycleStore, NodeState, Trigger, trigger_for_level
from vigil.remedy.policy import PolicyEngine

log = logging.getLogger("vigil.remedy")

# how long a command a dead owner left running is waited for when adopted (``vigil.remedy.commands``)
ADOPT_WAIT_S = 600.0
# how often the recovery rounds prune the records of settled commands (``Remediator.prune_commands``)
PRUNE_EVERY_S = 3600.0

# recovery rounds in a row at which a remembered run's close has failed before that is warned (once; debug until then)
UNCLOSED_WARN_AFTER = 10

# The lifecycle steps a successful action walks a node through, in order, from wherever it is.
LIFECYCLE_STEPS: dict[ActionKind, tuple[Trigger, ...]] = {
    ActionKind.CORDON: (Trigger.CORDON,),
    ActionKind.DRAIN: (Trigger.CORDON, Trigger.DRAIN),
    ActionKind.REBOOT: (Trigger.CORDON, Trigger.REPAIR, Trigger.DRAINED),
    ActionKind.VENDOR_TICKET: (Trigger.VENDOR,),
    ActionKind.UNCORDON: (Trigger.CLEAR, Trigger.SELF_CHECK_PASS),
}
# Lifecycle states in which a node action is already done (idempotence without asking the back end).
ALREADY_DONE: dict[ActionKind, frozenset[NodeState]] = {
    ActionKind.CORDON: frozenset(NodeState) - {NodeState.HEALTHY, NodeState.SUSPECT},
    # Not DRAINING: a drain that a PodDisruptionBudget held back is retried by the next drain action.
    ActionKind.DRAIN: frozenset({NodeState.REPAIRING, NodeState.SELF_CHECK, NodeState.VENDOR_REPAIR}),
    ActionKind.UNCORDON: frozenset({NodeState.HEALTHY}),
}

# How a skip says an action's work is there already, after its target: "node/n1 is already cordoned".
ALREADY_SAID: dict[ActionKind, str] = {
    ActionKind.ALERT: "already has an alert out",
    ActionKind.CORDON: "is already cordoned",
    ActionKind.UNCORDON: "is already uncordoned",
    ActionKind.DRAIN: "is already drained",
    ActionKind.RESET_GPU: "is already reset",
    ActionKind.REBOOT: "is already rebooted",
    ActionKind.RESTART_JOB: "is already restarted",
    ActionKind.MIGRATE_JOB: "is already migrated",
    ActionKind.VENDOR_TICKET: "already has a vendor ticket",
    ActionKind.RUN_DIAGNOSTICS: "already has its diagnostics run",
    ActionKind.COLLECT_LOGS: "already has its logs collected",
    ActionKind.PREEMPT_NOTICE: "already has its preemption notice",
    ActionKind.PREEMPT: "is already preempted",
    ActionKind.SET_QUOTA: "already has that quota",
    ActionKind.DELETE_CHECKPOINT: "already has that checkpoint deleted",
}


def already_done(action: Action, per: str = "") -> str:
    """The result of an action skipped because its work is done: per the lifecycle, or ``per`` a back end."""
    return f"{action.target} {ALREADY_SAID[action.kind]}" + (f", per {per}" if per else "")


def capacity_nodes(action: Action) -> list[str]:
    """The nodes an action takes out of service, which the blast-radius guard must admit: a cordon, drain or
    reboot's node; the bad nodes a migrate_job names (``params.nodes``), which it cordons or drains first."""
    if action.kind in CAPACITY_ACTIONS and parse_entity(action.target)[0] == "node":
        return [action.target]
    if action.kind is ActionKind.MIGRATE_JOB:
        try:
            return [node_id(name) for name in migration_nodes(action)]
        except ActuatorError:  # malformed: the actuator fails the action with this reason, nothing is reserved
            return []
    return []


def actions_from_plan(diagnosis: Diagnosis, ts: float, requested_by: str = "vigil-diagnosis") -> list[Action]:
    """A diagnosis' remediation plan (LLM or deterministic) as proposed actions for ``Remediator.execute``.

    The plan's steps are already whitelisted ActionKinds (pydantic rejects anything else); the
    Remediator still applies the guard, dry-run and audit to each.
    """
    return [
        Action(
            ts=ts,
            kind=step.action,
            target=step.target,
            incident_id=diagnosis.incident_id,
            reason=step.reason or diagnosis.summary,
            requested_by=requested_by,
            params={"risk": step.risk, "command": step.command, "generated_by": diagnosis.generated_by},
        )
        for step in diagnosis.plan
    ]


class Remediator:
    def __init__(
        self,
        actuators: Sequence[Actuator],
        audit: AuditLog,
        *,
        lifecycle: LifecycleStore | None = None,
        guard: BlastRadiusGuard | None = None,
        dry_run: bool = True,
        hold_dry_runs: bool = True,
        requested_by: str = "vigil",
        clock: Callable[[], float] = time.time,
        lease_s: float = DEFAULT_LEASE_S,
        renew_s: float = DEFAULT_RENEW_S,
        wait: Wait = wall_wait,
        adopt_wait_s: float = ADOPT_WAIT_S,
        commands_keep_s: float = KEEP_S,
    ) -> None:
        # the lease is its caller's to give, from the settings it runs under (``lease_of``): every command's remediator
        # (the server's, the engine's, the failover supervisor's, `vigil checkpoint clean`'s...) passes its own; read
        # from no global here, and the settings' defaults when none is given
        if not 0 < renew_s < lease_s:
            raise ValueError(f"lease renewal every {renew_s:g} s: expected more than 0 and less than the lease "
                             f"({lease_s:g} s)")
        self.actuators = list(actuators)
        self.audit = audit
        self.lifecycle = lifecycle
        self.guard = guard
        self.dry_run = dry_run
        # A dry run holds the nodes it would take out, as a live action would, so a dry-run flood shows the
        # refusals a live one would - within one bounded run (`vigil remedy apply`). A long-running server or
        # engine passes False: nothing it only proposes ever comes back into service, so held dry runs would
        # pile up until every dry run is refused; each dry run is then judged against what is out now.
        self.hold_dry_runs = hold_dry_runs
        self.requested_by = requested_by
        self.clock = clock
        # who runs an action, in the execution journal: this remediator, distinct from any other process's. Its
        # claim on a run lasts lease_s unless renewed every renew_s; the renewal waits with ``wait`` (a fake
        # clock's in tests). Settings remedy_lease_s / remedy_lease_renew_s.
        self.owner = f"{requested_by}-{uuid.uuid4().hex[:16]}"
        self.lease_s, self.renew_s = lease_s, renew_s
        self.wait = wait
        # how long a run taken over waits for a command its dead owner left running and that is adopted, not killed
        # (``vigil.remedy.commands``), before killing it
        self.adopt_wait_s = adopt_wait_s
        # how long the record of a settled command is kept (setting remedy_commands_keep_days): pruned by the
        # recovery rounds, the first and then hourly (``prune_commands``)
        self.commands_keep_s = commands_keep_s
        self._next_prune = 0.0
        # resumed runs that failed and whose close failed too (the database went away): key -> (the failed action,
        # whether the back end was asked, the id the guard holds its nodes for); closed at the next recovery round,
        # or before this remediator runs the same key again. The lock guards these dicts only, never a database call:
        # a key being closed is in ``_closing`` until its close has returned, and whoever wants that key meanwhile
        # waits on ``_unclosed_closed`` (``_close_remembered``) - the run is this remediator's, so a close after a
        # re-run of the key began would match that live run
        self._unclosed: dict[str, tuple[Action, bool, str]] = {}
        self._unclosed_tries: dict[str, int] = {}  # key -> rounds in a row its close failed again
        self._closing: set[str] = set()
        self._unclosed_lock = threading.Lock()
        self._unclosed_closed = threading.Condition(self._unclosed_lock)
        # runs taken over whose dead owner left a command to adopt (``vigil.remedy.commands``): each resumed on a
        # thread of its own (key -> thread), its action in ``_adopted`` once done (``wait_adopted``)
        self._adopting: dict[str, threading.Thread] = {}
        self._adopted: list[Action] = []
        self._adopting_lock = threading.Lock()

    def actuator_for(self, action: Action) -> Actuator | None:
        return next((a for a in self.actuators if a.accepts(action)), None)

    def handle(self, anomaly: Anomaly, engine: PolicyEngine, incident_id: str | None = None) -> list[Action]:
        """Record the fault on the node's lifecycle, plan with the policies, execute the plan."""
        self._note_fault(anomaly)
        return [self.execute(action) for action in engine.plan(anomaly, incident_id)]

    def execute_all(self, actions: Iterable[Action]) -> list[Action]:
        return [self.execute(action) for action in actions]

    def execute(self, action: Action, *, dry_run: bool = False) -> Action:
        """Decide ``action`` and audit the verdict. ``dry_run`` makes this one call a dry run on a remediator that
        executes (a server's preview of an approved action); nothing makes a dry-run remediator execute."""
        return self._execute(action, dry_run=dry_run)

    def _execute(self, action: Action, *, dry_run: bool = False, claimed: str | None = None,
                 asked: list[bool] | None = None) -> Action:
        """``execute``; ``claimed`` is the key of the run ``recover`` took over for ``action``, whose journal row a
        verdict reached before the back end (refused, skipped) closes, so no later takeover finds it started;
        ``asked`` gets an item just before the back end is asked to execute (``_decide``)."""
        action = action.model_copy(deep=True)
        action.dry_run = self.dry_run or dry_run
        action.requested_by = action.requested_by if action.requested_by != "vigil" else self.requested_by
        decided_as = action.id
        deciding = action.status is ActionStatus.PROPOSED or action.status is ActionStatus.APPROVED
        if deciding and self._decide(action, [] if asked is None else asked):
            return action
        # a verdict recorded beside the run under an id of its own (a repeat, a late answer) leaves the run as it is
        if claimed is not None and action.id == decided_as:
            if self.audit.finish(claimed, action.status.value, owner=self.owner, record=action):
                return action
            # this remediator's claim lapsed before the verdict and another process took the run over
            self._completed_late(action, claimed, [], action.status, action.result)
        if not self.audit.record_once(action):
            # Another process's run of this action recorded it first (both read it approved; this one then found
            # the node done, or its share taken): the record is that run's, and this verdict a repeat beside it.
            action.params["repeat_of"] = action.id
            action.id = new_id("act")
            self.audit.record(action)
        return action

    def _decide(self, action: Action, asked: list[bool]) -> bool:
        """Decide ``action`` in place; True when its verdict is recorded already, with the close of its run in the
        execution journal (one transaction: a process that finds the run closed finds its record). ``asked`` gets an
        item just before the back end is asked: raised after that, the nodes stay held (they may be out)."""
        actuator = self.actuator_for(action)
        if actuator is None:
            action.status, action.result = (
                ActionStatus.REFUSED,
                f"no actuator handles {action.kind.value} on {parse_entity(action.target)[0]} targets",
            )
            return False
        action.params.setdefault("actuator", actuator.name)
        if self._done_per_lifecycle(action):
            action.status, action.result = ActionStatus.SKIPPED, already_done(action)
            return False
        if not action.dry_run:
            self._close_remembered(str(action.params.get("idempotency_key", action.id)), settle=False)
        # The guard goes before asking the back end, so a flood of faults costs no API calls.
        guarded = capacity_nodes(action) if self.guard is not None else []
        if guarded:
            assert self.guard is not None
            verdict = self.guard.admit_all(guarded, reserve=self.hold_dry_runs or not action.dry_run,
                                           owner=action.id)
            if not verdict.admitted:
                action.status = ActionStatus.REFUSED
                action.result = (f"dry-run: the guard would refuse: {verdict.reason}" if action.dry_run
                                 else verdict.reason)
                return False
        held = action.id  # the id the guard holds the nodes for (a retry is recorded under another)
        try:
            return self._decide_admitted(action, actuator, guarded, asked)
        except BaseException:
            if asked:
                # raised after the back end was asked (the close on a dropped connection, the lifecycle's write):
                # the nodes may well be out, so they stay held until back in service, or a restart's takeover
                raise
            # raised before the back end was asked (the journal's begin, a bug), the nodes stay out of the share only
            # while a run holds them: held here, they would count against it for the rest of this process's life
            for node in guarded:
                assert self.guard is not None
                self.guard.release(node, owner=held)
            raise

    def _decide_admitted(self, action: Action, actuator: Actuator, guarded: list[str], asked: list[bool]) -> bool:
        """``_decide`` once the guard has admitted the nodes ``guarded`` (held for the action's id); ``asked`` gets an
        item just before the back end is asked to execute."""
        if action.dry_run:
            try:
                action.status, action.result = ActionStatus.PROPOSED, f"dry-run: would {actuator.describe(action)}"
            except ActuatorError as err:  # a target or parameter this back end cannot take
                action.status, action.result = ActionStatus.FAILED, f"{actuator.name}: {err}"
                if self.hold_dry_runs:
                    for node in guarded:
                        assert self.guard is not None
                        self.guard.release(node, owner=action.id)
            return False
        # The idempotency key is the action's id unless the caller names one: the same approved action executed
        # twice (a retry, a restart after kill -9) reaches the back end to completion once.
        key = str(action.params.setdefault("idempotency_key", action.id))
        now = self.clock()
        previous = self.audit.begin(key, action, owner=self.owner, now=now, lease_expires=now + self.lease_s)
        if previous == "done":
            if self.audit.action_of(key) == action.id:
                # the run's close settles the stored action; one closed before it did is settled from the run now
                self.audit.settle_from_run(action.id, key)
            self._repeated(action, key, guarded, f"already executed (idempotency key {key})")
            return False
        if previous == "running":
            self._repeated(action, key, guarded, f"running in another process (idempotency key {key})")
            return False
        # a run of this action that ended refused, skipped or failed (one resumed, or a crashed retry) may hold its
        # record's id: the close records this verdict under an id of its own then (``AuditLog.finish``); the guard
        # holds the nodes for the id they were admitted under
        held = action.id
        if self._done_per_actuator(action, actuator):
            action.status, action.result = ActionStatus.SKIPPED, already_done(action, per=actuator.name)
            if not self.audit.finish(key, "done", owner=self.owner, record=action):
                self._completed_late(action, key, guarded, action.status, action.result, held=held)
                return False
            # The back end is already there (Slurm's DRAIN is both cordon and drain): follow it.
            self._advance_lifecycle(action)
            return True
        try:
            with Renewal(self.audit, key, self.owner, lease_s=self.lease_s, renew_s=self.renew_s, clock=self.clock,
                         wait=self.wait):
                asked.append(True)
                # its commands recorded in the store, for this run's next owner should this process be killed outright
                with recording(CommandJournal(self.audit.engine, key, self.owner, action.kind)):
                    answer = actuator.execute(action)
        except Exception as err:  # the back end's error, or any other (a bug in it): the run ends failed either way
            refused = isinstance(err, (ActuatorError, OSError))
            if refused:
                action.status, action.result = ActionStatus.FAILED, f"{actuator.name}: {err}"
            else:
                log.exception("%s raised running %s on %s", actuator.name, action.kind.value, action.target)
                action.status = ActionStatus.FAILED
                action.result = f"{actuator.name}: {type(err).__name__}: {err}"
            if not self.audit.finish(key, "failed", owner=self.owner, record=action):
                self._completed_late(action, key, guarded, ActionStatus.FAILED, action.result, held=held)
                return False
            if refused:  # the back end's own error: it did not take the nodes out
                for node in guarded:
                    assert self.guard is not None
                    self.guard.release(node, owner=held)
            # any other (a parse error after the side effect, say) may have come after the nodes went out: they stay
            # held until back in service (an uncordon through this remediator) or this process ends
            return True
        action.status = ActionStatus.EXECUTED
        action.result = f"resumed after an interrupted run: {answer}" if previous == "started" else answer
        if not self.audit.finish(key, "done", owner=self.owner, record=action):
            self._completed_late(action, key, guarded, ActionStatus.EXECUTED, answer, held=held)
            return False
        self._advance_lifecycle(action)
        return True

    def _repeated(self, action: Action, key: str, guarded: list[str], result: str) -> None:
        """Another run under ``key`` holds the journal: it is running in another process, or done. The nodes this
        remediator reserved are that run's to take out. When that run is of this same action (its id executed twice
        at once: two servers, or a retry), the action's record is that run's to write, and this verdict is recorded
        under an id of its own naming the action (``params.repeat_of``)."""
        action.status, action.result = ActionStatus.SKIPPED, result
        for node in guarded:
            assert self.guard is not None
            self.guard.release(node, owner=action.id)
        if self.audit.action_of(key) == action.id:
            action.params["repeat_of"] = action.id
            action.id = new_id("act")

    def _completed_late(self, action: Action, key: str, guarded: list[str], status: ActionStatus,
                        result: str, *, held: str | None = None) -> None:
        """The back end answered after this remediator's claim on the run had lapsed (the process stalled past its
        lease: a pause, a frozen VM) and another process took the run over. The run, its journal row and the
        action's record are the resumed run's; this answer is recorded beside them, under an id of its own naming
        the action (``params.late_completion_of``) and who holds the run now (``params.claim_lost_to``). The
        lifecycle is left to the resumed run; the nodes this remediator reserved for the run are released, since
        its guard holds them for this process alone (the resumed run's process holds them in its own, and the
        lifecycle it advances holds them for all); ``held``: the id the guard holds them for, when not the action's."""
        for node in guarded:
            assert self.guard is not None
            self.guard.release(node, owner=held or action.id)
        holder = self.audit.owner_of(key)
        action.params.update(late_completion_of=action.id, claim_lost_to=holder)
        action.id = new_id("act")
        action.status = status
        action.result = f"late completion, after this run's claim lapsed and {holder} resumed it: {result}"

    def recover(self, stop: threading.Event | None = None,
                progress: Callable[[], None] | None = None) -> list[Action]:
        """Run again every action whose execution started and never finished, once its owner's lease has lapsed
        (the owner died: a live one renews it). Each resumes under its idempotency key (a half-done drain evicts
        what is left), so none completes twice.

        Taking a run over is a claim on its journal row (one UPDATE on the owner the journal named and its lapsed
        lease): of several processes on one database recovering at once (`vigil serve --no-engine` beside
        `vigil engine`), one resumes an action and the others leave it. A remediator never takes its own runs
        (the API and the engine of `vigil serve` share one); the resumed action's record names the owner it was
        taken from (``params.taken_over_from``) and when that owner's lease lapsed. A dry-run remediator takes
        nothing over: it would only say what it would run, and its claim would keep a live one from the run. Once
        ``stop`` is set (the process is stopping) no further run is claimed: the runs claimed already finish, and the
        rest are left to the next round or, past their lease, to another process.

        A run whose dead owner left a command this process adopts (waits for, up to ``adopt_wait_s``: a GPU reset, a
        reboot) is resumed on a thread of its own and is not in the list returned (``wait_adopted``): its wait holds
        neither the other runs of the round nor the round's caller (an engine's start, the next rounds). Should this
        process end meanwhile, the run stays claimed and its command recorded: the next owner settles it again.

        ``progress`` is called after each step (an engine's start-up marks its progress with it); the round also prunes
        the settled commands' records older than ``commands_keep_s`` (``prune_settled``), at most hourly."""
        self.prune_commands()
        if self.dry_run:
            return []
        self._close_unclosed()
        resumed = []
        for run in self.audit.unfinished_runs():
            if progress is not None:
                progress()
            if stop is not None and stop.is_set():
                break
            now = self.clock()
            if run.owner == self.owner or not self.audit.claim(run.key, self.owner, run.owner, now=now,
                                                               lease_expires=now + self.lease_s):
                continue  # this remediator's own run, a live owner's, or another process took it first
            if self._adopt_beside(run):
                continue
            resumed.append(self._resume(run))
        return resumed

    def prune_commands(self) -> None:
        """Delete the records of commands settled more than ``commands_keep_s`` ago (``prune_settled``), having marked
        abandoned those left open more than ``commands_keep_s`` + ``ABANDON_AFTER_KEEP_S`` ago that no owner will
        settle (``abandon_unsettled``: deleted a kept age later, never while open): at this remediator's first
        recovery round (a server's or engine's start), then at most hourly - every round of an engine, or of the
        pruning thread of `vigil serve --no-engine` and `vigil mcp` (``keep_pruning``). A failure is logged and tried
        again at the next round."""
        now = self.clock()
        if now < self._next_prune:
            return
        try:
            abandoned = abandon_unsettled(self.audit.engine, now - self.commands_keep_s - ABANDON_AFTER_KEEP_S, now)
            pruned = prune_settled(self.audit.engine, now - self.commands_keep_s)
        except Exception as err:  # the store briefly away: the next round tries again
            log.warning("pruning the records of settled back-end commands failed: %s", err)
            return
        self._next_prune = now + PRUNE_EVERY_S
        for row in abandoned:
            log.warning("back-end command %s of run %s marked abandoned: left %s by %s on %s since %s days ago and "
                        "never settled", row["argv"], row["key"], row["state"], row["owner"], row["host"],
                        f"{(now - row['started']) / 86400:.0f}")
        if pruned:
            log.info("pruned %d records of back-end commands settled more than %g days ago", pruned,
                     self.commands_keep_s / 86400)

    def keep_pruning(self, stop: threading.Event, every_s: float = PRUNE_EVERY_S) -> None:
        """``prune_commands`` now and then every ``every_s`` until ``stop`` is set: a process whose remediator runs no
        recovery rounds after its start (`vigil serve --no-engine`, `vigil mcp`; an engine's run every tick) prunes all
        the same - at its start too, as an engine's first round does, which a dry-run remediator's start skips."""
        while True:
            self.prune_commands()
            if stop.wait(every_s):
                return

    def _adopt_beside(self, run: UnfinishedRun) -> bool:
        """Resume ``run`` on a thread of its own when settling it waits for a command to adopt (``recover``)."""
        try:
            if not must_adopt(self.audit.engine, run.key, self.owner, run.action.kind):
                return False
        except Exception:  # the store failed: resumed here, where its failure closes the run (``_resume``)
            return False

        def resume() -> None:
            done = self._resume(run)
            with self._adopting_lock:
                self._adopted.append(done)
                self._adopting.pop(run.key, None)

        thread = threading.Thread(target=resume, name=f"vigil-adopt-{run.key}"[:60], daemon=True)
        with self._adopting_lock:
            self._adopting[run.key] = thread
        thread.start()
        return True

    def wait_adopted(self, timeout_s: float) -> list[Action]:
        """Wait, at most ``timeout_s``, for the runs resumed on threads of their own (``recover``) to end; returns
        (and forgets) the actions of those ended so far."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._adopting_lock:
                threads = list(self._adopting.values())
            if not threads or time.monotonic() >= deadline:
                break
            threads[0].join(max(0.0, deadline - time.monotonic()))
        with self._adopting_lock:
            done, self._adopted = self._adopted, []
        return done

    def _resume(self, run: UnfinishedRun) -> Action:
        """Run again an action this remediator has just claimed. Whatever its end, the run is closed in the journal
        with it: an error other than the back end's (a bug, the store failing mid-run) fails it, with the error."""
        action = run.action.model_copy(deep=True)
        if run.owner is not None:
            action.params["taken_over_from"] = run.owner
            action.params["lease_expired_at"] = run.lease_expires
        asked: list[bool] = []  # set just before the back end is asked: from then on the nodes may be out
        try:
            if self._left_running(run, action):
                return action
            return self._execute(action, claimed=run.key, asked=asked)
        except Exception as err:  # left started, the run would trip the next takeover on its record
            log.exception("resuming the interrupted run %s failed", run.key)
            action.status, action.result = ActionStatus.FAILED, f"resuming failed: {type(err).__name__}: {err}"
            held = action.id  # the close may give the record an id of its own (``params.retry_of``)
            try:
                self._close_failed(run.key, action, asked=bool(asked), held=held)
            except Exception as close_err:
                # the database went away (a dropped connection): the run stays started under this remediator's claim,
                # which no round of its own takes over - it is closed at this remediator's next recovery round, or
                # taken over by another process once the claim lapses; said once, not at every round
                with self._unclosed_lock:
                    self._unclosed[run.key] = (action, bool(asked), held)
                log.error("closing the failed resumed run %s (%s on %s) failed too: %s: %s; it is left started, closed "
                          "at the next recovery round or taken over by another server or engine once this process's "
                          "lease on it lapses", run.key, action.kind.value, action.target, type(close_err).__name__,
                          next(iter(str(close_err).splitlines()), ""))  # SQLAlchemy's: the SQL and a link below
            return action

    def _left_running(self, run: UnfinishedRun, action: Action) -> bool:
        """Settle the commands the run's earlier owners started and never saw end (``vigil.remedy.commands``): gone,
        killed or adopted on this host - kept in the action's ``params.earlier_commands`` - before the run goes on. One
        on another host may still run there: the run is closed failed instead of run again beside it (True)."""
        with Renewal(self.audit, run.key, self.owner, lease_s=self.lease_s, renew_s=self.renew_s, clock=self.clock,
                     wait=self.wait):
            found = settle_left_running(self.audit.engine, run.key, self.owner, action.kind, self.adopt_wait_s)
        if not found:
            return False
        action.params["earlier_commands"] = found
        unknown = [c for c in found if c["state"] == "unknown"]
        if not unknown:
            return False
        where = ", ".join(f"{' '.join(map(str, c['argv']))} (pid {c['pid']} on {c['host']})" for c in unknown)
        log.error("the run %s (%s on %s) taken over from %s is not run again: its command %s may still be running; "
                  "check, then execute the action again", run.key, action.kind.value, action.target, run.owner, where)
        action.status = ActionStatus.FAILED
        action.result = (f"not run again: the earlier run's command {where} may still be running there; check it, "
                         f"then execute the action again")
        if not self.audit.finish(run.key, "failed", owner=self.owner, record=action):
            self._completed_late(action, run.key, [], ActionStatus.FAILED, action.result)
            self.audit.record(action)
        return True

    def _close_failed(self, key: str, action: Action, *, asked: bool, held: str, settle: bool = True) -> bool:
        """Close the resumed run under ``key`` failed with ``action``, its failure (``_resume``): the close and the
        record in one transaction, as on every other path, so a process that finds the run closed finds its record;
        then the nodes the guard held for it (for ``held``) are released unless the back end was asked. False when this
        claim lapsed and another process took the run over; raises when the run cannot be closed at all (the database
        away). ``settle`` False leaves the stored action to the run of it that follows (``_close_remembered``)."""
        try:
            closed = self.audit.finish(key, "failed", owner=self.owner, record=action, settle_record=settle)
        except Exception:
            # whatever failed the record (the record itself, say) must not fail the close, nor leave the run started
            # for the next takeover to run the back end again: closed alone, the stored action settled
            closed = self.audit.finish(key, "failed", owner=self.owner, settle=action if settle else None)
            log.exception("recording the failed resumed run %s failed; closed it without its record", key)
        if not closed:
            # this claim lapsed meanwhile: the run is the process's that took it over, whose guard holds its nodes (and
            # the lifecycle it advances, for all), so this process's hold goes whether the back end was asked or not,
            # as in ``_completed_late``; a run this remediator closed itself (the lifecycle's write failed after a
            # close) keeps its nodes held
            if self.guard is not None and self.audit.owner_of(key) != self.owner:
                for node in capacity_nodes(action):
                    self.guard.release(node, owner=held)
            return False
        if self.guard is not None and not asked:
            # as in ``_decide``: raised before the back end was asked, nothing left the cluster; raised after it (the
            # close on a dropped connection, the lifecycle's write), the nodes may be out and stay held until back in
            # service or this process ends (the back end's own error released them in ``_decide``)
            for node in capacity_nodes(action):
                self.guard.release(node, owner=held)
        return True

    def _close_unclosed(self) -> None:
        """Close the failed resumed runs whose close failed (``_resume``); one that fails again waits for the next
        round, without a word more. One another thread is closing now (a re-run of its key) is left to it."""
        with self._unclosed_lock:
            keys = list(self._unclosed)
        for key in keys:
            try:
                self._close_remembered(key, wait=False)
            except Exception as err:
                with self._unclosed_lock:
                    if key not in self._unclosed:
                        continue
                    tries = self._unclosed_tries[key] = self._unclosed_tries.get(key, 0) + 1
                    action = self._unclosed[key][0]
                if tries != UNCLOSED_WARN_AFTER:
                    log.debug("closing the failed resumed run %s failed again", key, exc_info=True)
                    continue
                log.warning("closing the failed resumed run %s (%s on %s) failed again at %d recovery rounds in a "
                            "row: %s: %s; it stays started, tried again every round (said once)", key,
                            action.kind.value, action.target, tries, type(err).__name__,
                            next(iter(str(err).splitlines()), ""))

    def _close_remembered(self, key: str, *, settle: bool = True, wait: bool = True) -> None:
        """Close the failed resumed run under ``key`` whose close failed (``_resume``), if there is one; raises when it
        fails again. Called before this remediator runs ``key`` again too (an operator executing the same approved
        action): the run is this remediator's own, so ``begin`` takes it back, and a close left for the next round
        would close that live run failed, settle its action failed and release the nodes the guard holds for it.
        Closed first (its record written; with ``settle`` False the stored action left to the re-run's verdict), the
        re-run finds the run failed and runs as a retry.

        The close runs outside the lock, the key marked as being closed (``_closing``) until it returns; the entry
        goes only then. A caller that finds the key being closed by another thread waits for that close to end
        (``wait``; a recovery round passes False and leaves the key to it), then looks again: closed, there is
        nothing left to close and its re-run begins after the close, never beside it; failed, the entry is still
        there and this caller closes it itself (or raises, its re-run not begun). Only ``_resume`` adds an entry, for a
        run this remediator claimed from another owner, and never for a key it remembers already (its own runs are
        not claimed): so no close of a key can start once a re-run of it has found the key without an entry."""
        with self._unclosed_closed:
            while key in self._closing:
                if not wait:
                    return
                self._unclosed_closed.wait()
            entry = self._unclosed.get(key)
            if entry is None:
                return
            self._closing.add(key)
        closed = False
        try:
            action, asked, held = entry
            closed = self._close_failed(key, action, asked=asked, held=held, settle=settle)
            with self._unclosed_lock:
                del self._unclosed[key]
                self._unclosed_tries.pop(key, None)
        finally:
            with self._unclosed_closed:
                self._closing.discard(key)
                self._unclosed_closed.notify_all()
        if closed:
            log.warning("closed the failed resumed run %s (%s on %s) at a later recovery round", key,
                        action.kind.value, action.target)

    def finish_repair(self, node: str, self_check_passed: bool, detail: str = "") -> NodeState:
        """Close a repair (reset / reboot done): record the self-check, and return the node if it passed.

        A failed self-check sends the node back to repair, or to the vendor after the lifecycle's
        ``max_repairs``; a pass uncordons it through the actuators (audited like any action).
        """
        if self.lifecycle is None:
            raise ValueError("finish_repair needs a lifecycle store")
        self.lifecycle.apply(node, Trigger.REPAIRED, detail)
        trigger = Trigger.SELF_CHECK_PASS if self_check_passed else Trigger.SELF_CHECK_FAIL
        if self_check_passed:
            self.execute(
                Action(
                    ts=self.clock(),
                    kind=ActionKind.UNCORDON,
                    target=node,
                    reason=f"self-check passed {detail}".strip(),
                )
            )
        status = self.lifecycle.status(node)
        if status.state is NodeState.SELF_CHECK:
            status = self.lifecycle.apply(node, trigger, detail)
        if status.state is NodeState.VENDOR_REPAIR:
            self.execute(
                Action(
                    ts=self.clock(),
                    kind=ActionKind.VENDOR_TICKET,
                    target=node,
                    reason=f"self-check failed after {status.repair_attempts} repairs {detail}".strip(),
                )
            )
        return self.lifecycle.status(node).state

    def _done_per_lifecycle(self, action: Action) -> bool:
        if self.lifecycle is None or parse_entity(action.target)[0] != "node":
            return False
        done_states = ALREADY_DONE.get(action.kind, frozenset())
        return self.lifecycle.status(action.target).state in done_states

    @staticmethod
    def _done_per_actuator(action: Action, actuator: Actuator) -> bool:
        try:
            return actuator.is_satisfied(action)
        except Exception as err:  # cannot tell; executing an idempotent back-end call is the safe side
            if not isinstance(err, (ActuatorError, OSError)):
                log.exception("%s raised asking whether %s on %s is done", actuator.name, action.kind.value,
                              action.target)
            return False

    def _note_fault(self, anomaly: Anomaly) -> None:
        if self.lifecycle is None or self.dry_run or parse_entity(anomaly.entity)[0] not in ("node", "gpu", "nic"):
            return
        node = node_of(anomaly.entity)
        if (
            node is not None
            and trigger_for_level(anomaly.level) is Trigger.SUSPECT
            and self.lifecycle.can(node, Trigger.SUSPECT)
        ):
            self.lifecycle.apply(node, Trigger.SUSPECT, f"{anomaly.fault_type} ({anomaly.level.label})")

    def _advance_lifecycle(self, action: Action) -> None:
        if self.lifecycle is None:
            return
        if action.kind is ActionKind.MIGRATE_JOB:
            steps, nodes = LIFECYCLE_STEPS[ActionKind.CORDON], capacity_nodes(action)
        elif parse_entity(action.target)[0] == "node":
            steps, nodes = LIFECYCLE_STEPS.get(action.kind, ()), [action.target]
        else:
            return
        for node in nodes:
            for trigger in steps:
                if self.lifecycle.can(node, trigger):
                    self.lifecycle.apply(node, trigger, f"{action.kind.value}: {action.reason}"[:500])
            if self.guard is not None and self.lifecycle.status(node).state.in_service:
                self.guard.release(node)
