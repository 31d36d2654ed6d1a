"""The live loop: what agents pushed and Prometheus holds -> detectors -> incidents -> diagnosis -> actions -> alerts.

Each tick reads what arrived since the last one - events and metric pushes in the store's read order (their
writing transaction, then row id), one PromQL instant query when a Prometheus-compatible API is configured - turns
the latest value of every entity into one frame per family, runs the detectors, groups anomalies into incidents
and, for every incident that is new or changed, stores it, ranks its root causes, proposes the policies' actions
(dry-run: proposals wait for approval) and notifies. An incident resolves once its signals have been quiet for
``resolve_after_s``.

Restart-safe: the read position is a cursor in the store, written after a tick's outputs; it misses no row
whatever order writers commit in (vigil.store.sql.ReadPosition). Anomaly, incident
and action ids are derived from what they are about, so a tick replayed after ``kill -9`` writes the same rows
again instead of new ones; open incidents are taken up again at start.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import numpy as np

from vigil.config import Settings, read_yaml
from vigil.detect.incidents import IncidentGrouper
from vigil.detect.rules import RuleDetector
from vigil.detect.stream import LearnedStreamDetector, learned_detectors
from vigil.diagnose.kg import KnowledgeGraph
from vigil.diagnose.llm import LlmClient, diagnose, diagnosis_wait_s
from vigil.diagnose.memory import recall, remember
from vigil.diagnose.rca import analyze_incident
from vigil.knowledge.metrics import ENTITY_FAMILIES, family_metrics
from vigil.model import (
    Anomaly,
    Diagnosis,
    Event,
    Incident,
    IncidentStatus,
    Job,
    Topology,
    VigilInputError,
    anomaly_id_for,
    parse_entity,
    stable_id,
)
from vigil.remedy.commands import this_host
from vigil.remedy.notify import AlertmanagerNotifier, Notifier, WebhookNotifier
from vigil.remedy.policy import PolicyEngine, load_policies
from vigil.remedy.remediator import Remediator
from vigil.sources.collect.kube_jobs import KubernetesJobs
from vigil.sources.collect.slurm import SlurmJobs, placement
from vigil.sources.launch import JOB_ENDED
from vigil.sources.promql import PromQLSource
from vigil.store.metrics import MetricFrame
from vigil.store.sql import LeaseLost, MetricPush, ReadPosition, Store

log = logging.getLogger("vigil.engine")

CURSOR = "engine"
# The lease one engine of a store holds while it judges (a row of ``cursors``): the others on the store stand by.
LEASE = "engine.lease"
# Records this far around an incident are what its diagnosis may cite.
DIAGNOSIS_SLACK_S = 900.0
# An open incident whose signals keep firing is rewritten this often (its end time), not every tick.
REWRITE_EVERY_S = 60.0
# Rows held back this long by one transaction still running on PostgreSQL are warned of (Engine._watch_held_back).
HELD_BACK_WARN_S = 60.0
# How many events and metric pushes committed past a transaction still running (PostgreSQL) the engine judges at
# once and remembers, not to judge them again once that transaction ends (Engine._take); past these it holds further
# ones back until it ends. Events' are kept in the cursor (a restart judges none of them again); pushes' in memory
# only (a restart reads them again, as its replay does). Under the batch, so the rows remembered never fill a read.
AHEAD_EVENTS = 1_000
AHEAD_PUSHES = 5_000
# With setting engine_read_ahead_pushes 0, the pushes' bound follows the load: this many a node pushing (10 minutes
# at the agent's push_interval_s of 15 s), at least AHEAD_PUSHES - 1,000 nodes fill 5,000 in 75 s, 40,000 in 10 min.
AHEAD_PUSHES_PER_NODE = 40

_T = TypeVar("_T")


class LiveFrames:
    """The latest value of every (entity, metric) that sources report, as one frame per family.

    A frame holds the catalogue's metrics of its family that some source has reported (a column appears the
    first time one does), so a metric no exporter here produces is absent, not a column of NaN that a rule
    would read as a vanished device. A node's report lists everything it currently sees: an entity in the
    node's last report that is missing from this one while its siblings are present has gone (a GPU fallen
    off the bus) and reads NaN; a node that stops reporting keeps its last values (its agent may be late).

    Late reports cannot roll the view back. A report applied with its time (``ts``: its newest sample's) sets a
    value only where it is at least as new as the report that set the value held; a report older than the node's
    newest (an agent sending its backlog after an outage, a push that waited in a queue) sets only values a newer
    report has not set since, adds no entity or metric the view does not hold, and takes no entity for gone.
    """

    def __init__(self, families: Mapping[str, Sequence[str]]) -> None:
        self.catalogue = {family: frozenset(metrics) for family, metrics in families.items()}
        self.columns: dict[str, dict[str, int]] = defaultdict(dict)
        self._rows: dict[str, dict[str, int]] = defaultdict(dict)
        self._values: dict[str, np.ndarray] = {}
        # the time of the report that set each value (-inf: none with a time did), as _values
        self._times: dict[str, np.ndarray] = {}
        self._reported: dict[str, set[str]] = {}
        self._newest: dict[str, float] = {}

    def newest(self, node: str) -> float:
        """The time of the newest report of ``node`` applied (-inf: none)."""
        return self._newest.get(node, -np.inf)

    def apply(self, node: str, points: Iterable[tuple[str, str, float]], ts: float | None = None) -> int:
        """Take ``node``'s report of ``points`` made at ``ts`` (None: as new as any, the times held kept); returns
        how many of its values it left unset as older than the view's (the catalogue's metrics only)."""
        older = ts is not None and ts < self.newest(node)
        reported: set[str] = set()
        kept = 0
        for metric, entity, value in points:
            family = parse_entity(entity)[0]
            if metric not in self.catalogue.get(family, ()):
                continue
            if ts is not None and older:
                row_of, column_of = self._rows[family].get(entity), self.columns[family].get(metric)
                if row_of is None or column_of is None:
                    kept += 1  # not in the view a newer report left
                    continue
                row, column = row_of, column_of
                held = self._times[family][row, column]
                if held == -np.inf or ts < held:
                    kept += 1  # newer than this report, or no report with a time set it: not rolled back
                    continue
            else:
                row, column = self._row(family, entity), self._column(family, metric)
                reported.add(entity)
                if ts is not None and ts < self._times[family][row, column]:
                    kept += 1  # another source's newer report set it
                    continue
            self._values[family][row, column] = value
            if ts is not None:
                self._times[family][row, column] = ts
        if older:
            return kept
        families_now = {parse_entity(e)[0] for e in reported}
        for entity in self._reported.get(node, set()) - reported:
            family = parse_entity(entity)[0]
            if family in families_now:
                row = self._rows[family][entity]
                self._values[family][row, : len(self.columns[family])] = np.nan
                if ts is not None:
                    self._times[family][row, : len(self.columns[family])] = ts
        self._reported[node] = reported
        if ts is not None:
            self._newest[node] = ts
        return kept

    def reset_times(self, node: str) -> None:
        """Forget the times of ``node``'s values and its newest report (its clock was set back): its next report
        is applied as new whatever its time."""
        self._newest.pop(node, None)
        for entity in self._reported.get(node, set()):
            family = parse_entity(entity)[0]
            row = self._rows[family].get(entity)
            if row is not None:
                self._times[family][row, : len(self.columns[family])] = -np.inf

    def _grow(self, family: str, rows: int, columns: int) -> None:
        """Room for ``rows`` x ``columns`` in ``family``'s arrays, their capacity doubled where it falls short: a
        new entity copies the arrays once in a while, not each time (10,000 GPUs taken one by one)."""
        old = self._values.get(family, np.empty((0, 0), dtype=np.float32))
        if rows <= old.shape[0] and columns <= old.shape[1]:
            return
        shape = (max(rows, 2 * old.shape[0]) if rows > old.shape[0] else old.shape[0],
                 max(columns, 2 * old.shape[1]) if columns > old.shape[1] else old.shape[1])
        grown = np.full(shape, np.nan, dtype=np.float32)
        grown[: old.shape[0], : old.shape[1]] = old
        self._values[family] = grown
        old_times = self._times.get(family, np.empty((0, 0)))
        times = np.full(shape, -np.inf)
        times[: old_times.shape[0], : old_times.shape[1]] = old_times
        self._times[family] = times

    def _row(self, family: str, entity: str) -> int:
        rows = self._rows[family]
        row = rows.get(entity)
        if row is None:
            row = rows[entity] = len(rows)
            self._grow(family, len(rows), len(self.columns[family]))
        return row

    def _column(self, family: str, metric: str) -> int:
        columns = self.columns[family]
        column = columns.get(metric)
        if column is None:
            column = columns[metric] = len(columns)
            self._grow(family, len(self._rows[family]), len(columns))
        return column

    def forget(self, entity: str) -> None:
        """An entity that is gone for good (a job that ended): its values read NaN, not its last report."""
        family = parse_entity(entity)[0]
        row = self._rows.get(family, {}).get(entity)
        if row is not None:
            columns = len(self.columns[family])
            self._values[family][row, :columns] = np.nan
            # a report older than the last one of it (a backlog sent late) does not bring it back
            self._times[family][row, :columns] = self._times[family][row, :columns].max(initial=-np.inf)
        for reported in self._reported.values():
            reported.discard(entity)

    def frames(self, ts: float) -> list[MetricFrame]:
        return [
            MetricFrame(ts=ts, family=family, entities=list(rows), metrics=list(self.columns[family]),
                        values=self._values[family][: len(rows), : len(self.columns[family])].copy())
            for family, rows in self._rows.items() if rows
        ]


@dataclass
class TickReport:
    # another engine holds the store's lease: this one read and judged nothing
    standby: bool = False
    events: int = 0
    pushes: int = 0
    # pushes older than live_push_max_age_s (stored, not judged live) and pushes older than some value the live
    # view held of their series (that value kept)
    stale: int = 0
    late: int = 0
    anomalies: int = 0
    opened: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    resolved: list[str] = field(default_factory=list)
    actions: int = 0
    seconds: float = 0.0


@dataclass
class _Known:
    """What was last written for an incident: a change in any of these is news."""

    anomalies: tuple[str, ...]
    level: int
    status: str
    end: float
    written: float


class Engine:
    """One engine over one store. ``tick`` does one round; ``run`` loops until ``stop`` is set."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        prom: PromQLSource | None = None,
        notifiers: Sequence[Notifier] | None = None,
        clock: Callable[[], float] = time.time,
        batch: int = 10_000,
        kube_jobs: KubernetesJobs | None = None,
        remediator: Remediator | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.prom = prom
        self.clock = clock
        self.batch = batch
        self.notifiers: list[Notifier] = list(notifiers) if notifiers is not None else notifiers_from(settings)
        self.policies = PolicyEngine(load_policies(settings.policies_file or None), clock=clock)
        self.llm = LlmClient.from_settings(settings)
        self.frames = LiveFrames({family: family_metrics(family) for family in ENTITY_FAMILIES})
        self.topology = Topology()
        self.topology_version = -1
        self.detector = RuleDetector(self.topology)
        # Trained models beside the rules; a configured model that is not there is a configuration error.
        model = Path(settings.detector_model) if settings.detector_model else None
        self.learned: list[LearnedStreamDetector] = learned_detectors(self.topology, settings.home, model)
        self.remediator = remediator
        self.resumed_actions = 0
        self._resuming: threading.Thread | None = None
        # stopping waits for the round in flight until one deadline, however many callers wait (the loop's end,
        # the command's), and says once that it gave up; no round starts once stopping has begun
        self._resume_lock = threading.Lock()
        self._finish_by: float | None = None
        self._gave_up = False
        self.grouper = IncidentGrouper(self.topology, resolve_after_s=settings.resolve_after_s)
        self._kg: KnowledgeGraph | None = None
        self._anomalies: dict[str, Anomaly] = {}
        self._known: dict[str, _Known] = {}
        self._notified: dict[str, float] = {}
        # how far events and metric pushes are read (the last row's position; see ReadPosition)
        self.event_cursor = ReadPosition(0, 0)
        self.push_cursor = ReadPosition(0, 0)
        # since when rows committed past the cursors have waited for an older transaction (PostgreSQL), and whether
        # that was logged
        self.held_since: float | None = None
        self._held_by: int | None = None
        self._warned_held = False
        # positions of the rows read past the cursors (committed while an older transaction still ran), judged already
        self.ahead_events: set[ReadPosition] = set()
        self.ahead_pushes: set[ReadPosition] = set()
        # whether a bound on those was reached, so that rows were held back
        self.ahead_full = False
        self.stale_pushes = 0
        self.late_pushes = 0
        self.pruned_pushes = 0
        # per node: its newest push's stamp less the time the engine read it (its clock's lead, less the delay)
        self.push_offsets: dict[str, float] = {}
        self._warned_stale: set[str] = set()
        self.ticks = 0
        self.last_tick: TickReport | None = None
        self.stop = threading.Event()
        self._started = False
        # One engine judges a store at a time: it holds the lease LEASE (renewed by a thread of its own, every tick and
        # with the cursor's write, which it fences); the others stand by until it lapses (remedy_lease_s) or its
        # process here has ended. Its owner (``engine_owner``): host and pid namespace, pid and a token of this process.
        self.owner = engine_owner()
        self.lease_s = settings.remedy_lease_s
        # The loop marks its progress (``_progress``: every round, every step of a start-up and of a tick); the
        # renewing thread renews only while the last mark is at most ``stuck_after_s`` old - a hung loop (a call that
        # never returns) lets the lease lapse, for a standby engine to take over. ``_stalled``: the renewing thread
        # stopped so; the loop, should it move again, checks the lease before it writes anything more.
        # The step bound is at least one diagnosis's wait on an LLM endpoint that times out at every attempt (2
        # completions x 3 attempts x llm_timeout_s, + backoffs: 183 s by default, 363 s at llm_timeout_s 60), a step
        # of its own: a healthy engine diagnosing against a slow endpoint is not taken for hung.
        self.stuck_after_s = settings.engine_interval_s + max(settings.engine_step_max_s, diagnosis_wait_s(self.llm))
        self._beat = time.monotonic()
        self._stalled = False
        self.standing_by: str | None = None
        # While it holds the lease, a thread of its own renews it every third of it, so that a long start-up (actions
        # resumed, a moved store renumbered: ~47 s at 1,000,000 events) or a long tick does not let it lapse; what
        # that thread found (another engine took it since) ends the next tick.
        self._keeper: threading.Thread | None = None
        self._keeper_stop = threading.Event()
        self._lease_lost: LeaseLost | None = None
        # `vigil serve`: an engine that lost the lease stands by again (state dropped, read again from the store when
        # it takes over) instead of ending; `vigil engine` ends, exit 1, for its supervisor to restart
        self.stand_by_on_loss = False
        self.slurm = SlurmJobs() if settings.slurm_poll_s > 0 else None
        self._next_slurm = 0.0
        if kube_jobs is None and settings.kube_jobs_poll_s > 0:
            kube_jobs = KubernetesJobs()
        self.kube_jobs = kube_jobs
        self._next_kube = 0.0

    # ---------------------------------------------------------------- start-up

    def start(self, wait: bool = True) -> bool:
        """Take the store's engine lease (``wait``: standing by until it is free, or ``stop`` is set), then take up
        where the last engine stopped: actions it left half done, cursor, open incidents, the latest metric values.
        False where the lease was not taken."""
        if not self._await_lease(wait):
            return False
        self._keep_lease()
        self._start()
        return True

    def _keep_lease(self) -> None:
        """Renew the lease on a thread of its own every third of ``lease_s`` until ``release`` (or a loss): it holds
        while this process lives and reaches the store, however long a start-up or a tick takes. Renewal goes on
        where the lease lapsed meanwhile (the store out of reach) and no other engine took it; one that did is noted
        in ``_lease_lost``, which the next tick raises."""
        if self._keeper is not None and self._keeper.is_alive():
            return
        self._keeper_stop = stop = threading.Event()
        self._lease_lost = None
        self._stalled = False
        self._beat = time.monotonic()
        # the thread holds the engine weakly, and its store only through it (so neither outlives its last user for
        # the thread's sake), and ends once the engine is gone or its store closed (one never released)
        engine, owner, every = weakref.ref(self), self.owner, self.lease_s / 3

        def keep() -> None:
            while not stop.wait(every):
                live = engine()
                if live is None or live.store.closed:
                    return
                if live._stuck():
                    return
                try:
                    live.store.renew_lease(LEASE, owner, time.time() + live.lease_s)
                except LeaseLost as err:
                    live._lease_lost = err
                    return
                except Exception as err:  # the store briefly out of reach: the next try, or the tick's, renews it
                    log.warning("renewing the engine lease failed (retrying in %g s): %s", every, err)
                del live

        self._keeper = threading.Thread(target=keep, name="vigil-engine-lease", daemon=True)
        self._keeper.start()

    def _stuck(self) -> bool:
        """Whether the loop has shown no progress for ``stuck_after_s`` (the renewing thread's check): then the lease is
        no longer renewed, said in one line, and ``_stalled`` set for the loop to check the lease should it move
        again."""
        idle = time.monotonic() - self._beat
        if idle <= self.stuck_after_s:
            return False
        self._stalled = True
        log.error("the engine's loop has shown no progress for %.0f s (more than engine_interval_s + "
                  "engine_step_max_s, %g s): this engine (%s) stops renewing the store's engine lease, which lapses "
                  "within %g s for a standby engine to take over; should the loop move again, it checks the lease "
                  "before writing anything more", idle, self.stuck_after_s, self.owner, self.lease_s)
        return True

    def _progress(self) -> None:
        """The loop moved on (a round, a step of a start-up or a tick): the mark the renewing thread reads. After a
        stall past ``stuck_after_s`` the lease is checked first: LeaseLost where another engine took it meanwhile,
        else it is renewed and kept again."""
        self._mark()
        if self._lease_lost is not None:
            raise self._lease_lost
        if not self._stalled:
            return
        self.store.renew_lease(LEASE, self.owner, time.time() + self.lease_s)
        log.warning("the engine's loop moves again and no other engine took its lease meanwhile: this engine (%s) "
                    "renews it again and judges on", self.owner)
        self._stop_keeping()
        self._keep_lease()

    def _mark(self) -> None:
        """The loop's mark of progress alone (``_progress`` without its check): within a step that writes nothing of
        the engine's own (a resumed action's run, under a claim of its own)."""
        self._beat = time.monotonic()

    def _stop_keeping(self) -> None:
        self._keeper_stop.set()
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join()
        self._keeper = None

    def _await_lease(self, wait: bool) -> bool:
        """Take the lease LEASE; another engine holding it, stand by (one line, once) and try again every
        ``engine_interval_s`` until it lapses - a killed engine's after ``remedy_lease_s``, at once for one of this
        host whose process has ended - unless not ``wait`` or ``stop`` is set."""
        while not self.stop.is_set():
            now = time.time()
            if self.store.take_lease(LEASE, self.owner, now, now + self.lease_s, _process_gone):
                if self.standing_by is not None:
                    log.warning("taking over from engine %s: this engine (%s) holds the store's engine lease and "
                                "reads on from the cursor", self.standing_by, self.owner)
                self.standing_by = None
                return True
            holder = self.store.lease_holder(LEASE)
            who = holder[0] if holder else "another engine"
            if self.standing_by != who:
                log.warning("standing by: engine %s judges this store (its lease lapses %.0f s from now unless "
                            "renewed); this one (%s) takes over once it lapses", who,
                            (holder[1] - now) if holder else 0.0, self.owner)
                self.standing_by = who
            if not wait:
                return False
            self.stop.wait(min(self.settings.engine_interval_s, self.lease_s / 3))
        return False

    def close(self) -> None:
        """Stop for good: no round after the one in flight, which is waited for with the round of resumed actions
        (``finish_resuming``, at most one lease), and the lease given up, its renewing thread ended (``release``) -
        the engine leaves no thread, and no connection checked out of its store's pool, behind. The store stays open:
        it is its opener's to close. ``with Engine(...) as engine:`` closes it at the block's end."""
        self.stop.set()
        self.finish_resuming()
        self.release()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def release(self) -> None:
        """Give the lease up (a clean stop): an engine standing by takes over at its next try."""
        held = self._started or self._keeper is not None
        self._stop_keeping()  # before: a renewal after it would take the lease back
        if held:
            try:
                self.store.release_lease(LEASE, self.owner)
            except Exception as err:  # the store down: it lapses by itself
                log.warning("giving the engine lease up failed (it lapses in %g s): %s", self.lease_s, err)

    def _start(self) -> None:
        # An action whose execution a killed predecessor began is finished (or refused) before anything new.
        self._progress()
        self._resume_interrupted(progress=self._mark)
        self._progress()
        _, state = self.store.cursor(CURSOR)
        self.event_cursor = self._position(state, "events", "events")
        self.push_cursor = self._position(state, "pushes", "metric_pushes")
        self.ahead_events = {ReadPosition(int(x), int(i)) for x, i in state.get("events_ahead") or []}
        self.ticks = int(state.get("ticks", 0))
        self._place_moved()
        self._progress()
        if self.settings.topology_file:
            self.store.place_nodes(load_topology_file(Path(self.settings.topology_file)))
        self._refresh_topology()
        for incident in self.store.incidents(status=IncidentStatus.OPEN, limit=100_000) + self.store.incidents(
                status=IncidentStatus.ACKNOWLEDGED, limit=100_000):
            self._mark()
            anomalies = self.store.anomalies(since=incident.start - 1, limit=100_000, ids=incident.anomalies)
            self.grouper.resume(incident, anomalies)
            for anomaly in anomalies:
                self._anomalies[anomaly.id] = anomaly
                self._resume(anomaly)
            self._known[incident.id] = self._signature(incident, self.clock())
            self._notified[incident.id] = 0.0
        # The values before the cursor, so a counter that rose while the engine was down shows its rise.
        # The newest pushes read before the restart within live_push_max_age_s, under the rules of a tick's.
        self._progress()
        now = self.clock()
        replay = self.store.latest_pushes(self.push_cursor, now - self.settings.live_push_max_age_s,
                                          limit=self.batch)
        self._mark()
        for push in replay:
            self._apply_push(push, now, TickReport())
        # counted and measured when they were first read
        self.stale_pushes = int(state.get("stale_pushes", 0))
        self.late_pushes = int(state.get("late_pushes", 0))
        self.push_offsets = {str(node): float(v) for node, v in dict(state.get("push_offsets") or {}).items()}
        if replay:
            # A job that ended in the replayed span has stopped reporting: its last values are not a stall.
            for event in self.store.events(kind="job", since=min(p.ts for p in replay) - 1, limit=100_000):
                if event.attrs.get("reason") in JOB_ENDED:
                    self.frames.forget(event.entity)
            self._detect(self.frames.frames(min(now, max(p.ts for p in replay))), [], TickReport())
        self._progress()
        self._started = True

    def _place_moved(self, running: bool = False) -> None:
        """A read position saved on another PostgreSQL server (the store dumped and restored, or moved by logical
        replication, or a failover to a server whose transaction counter runs lower) holds that server's xid, past
        every one this server has given: every row written here would sort before it, never read. Such a store is
        renumbered once (``Store.renumber_moved``), warned of in one line, and the cursor saved. Checked at start and,
        ``running``, at every tick (one query for the server's next xid): a move under a running engine - its
        database URL pointing at the new server, a proxy or DNS name switched - is placed at the next tick, the rows
        it remembers judged ahead (events' and pushes') renumbered with it."""
        if running:
            next_xid = self.store.next_xid()
            if next_xid is None or max(self.event_cursor.xid, self.push_cursor.xid) < next_xid:
                return
        before = (tuple(self.event_cursor), tuple(self.push_cursor))
        # progress after every span of ids renumbered: a table of millions of rows takes minutes (~47 s a 1,000,000)
        self._progress()
        events = self.store.renumber_moved("events", self.event_cursor, self.ahead_events, progress=self._progress)
        pushes = self.store.renumber_moved("metric_pushes", self.push_cursor, self.ahead_pushes,
                                           progress=self._progress)
        self._progress()
        if events is None and pushes is None:
            return
        if events is not None:
            self.event_cursor, self.ahead_events = events
        if pushes is not None:
            self.push_cursor, self.ahead_pushes = pushes
        log.warning("the engine's read position (events %s, metric pushes %s) holds transaction ids this PostgreSQL "
                    "server has not reached: the store was moved from another server%s; rows read and unread were "
                    "renumbered, reading on after the last read from (events %s, metric pushes %s), none skipped, "
                    "none judged again", *before, " while the engine ran" if running else "",
                    tuple(self.event_cursor), tuple(self.push_cursor))
        self._save_cursor()

    def _position(self, state: Mapping[str, Any], name: str, table: str) -> ReadPosition:
        """A read position as the cursor holds it; one saved before store revision 0011 holds the row id alone."""
        row_id = int(state.get(name, 0))
        if f"{name}_xid" in state:
            return ReadPosition(int(state[f"{name}_xid"]), row_id)
        return self.store.position_of(table, row_id)

    def _resume(self, anomaly: Anomaly) -> None:
        """Hand an anomaly stored before a restart back to the detector that found it."""
        if anomaly.detector == self.detector.name:
            self.detector.resume(anomaly)
        for learned in self.learned:
            if anomaly.detector == learned.name:
                learned.resume(anomaly)

    def _resume_interrupted(self, progress: Callable[[], None] | None = None) -> None:
        """Resume the actions whose owner died mid-run (its lease lapsed): at start, a killed predecessor's, before
        anything new (``progress``: the loop's mark, after each run). A dry-run remediator (execute_actions off)
        resumes nothing; once ``stop`` is set, no further run of the round is claimed (those claimed finish)."""
        if self.remediator is not None:
            self.resumed_actions += len(self.remediator.recover(stop=self.stop, progress=progress))

    def _resume_beside(self) -> None:
        """Every tick, resume the actions of a server or engine beside this one that died, on a thread of its own:
        a resumed drain may evict for minutes, and detection goes on meanwhile. One round at a time; a round that
        fails is logged and the next tick tries again."""
        with self._resume_lock:
            if self.remediator is None or self.stop.is_set() or self._finish_by is not None or (
                    self._resuming is not None and self._resuming.is_alive()):
                return
            # a daemon: stopping waits for it (finish_resuming), but only so long
            self._resuming = threading.Thread(target=self._resume_logged, name="vigil-engine-resume", daemon=True)
            self._resuming.start()

    def finish_resuming(self, loop: threading.Thread | None = None) -> bool:
        """Wait for the round of resumed actions in flight (``_resume_beside``) to end, so that stopping the engine
        (``run``'s end, `vigil serve`'s shutdown) or ``vigil engine --once`` does not end the process mid-drain; with
        ``loop``, the thread running ``run`` too (its tick in flight may be executing, or resuming at start). At most
        one lease from the first call, however many callers wait, since a round that runs longer keeps its runs by
        renewing and this process must stop some time; no round starts after the first call. False when it gave up,
        logged once: its runs are taken over once this process's lease on them lapses. Without a remediator (no back
        end) there is no round, but the tick in flight is waited for all the same, as long (setting remedy_lease_s)."""
        lease_s = self.remediator.lease_s if self.remediator is not None else self.settings.remedy_lease_s
        with self._resume_lock:
            if self._finish_by is None:
                self._finish_by = time.monotonic() + lease_s
            resuming, finish_by = self._resuming, self._finish_by
        waiting = [thread for thread in (resuming, loop) if thread is not None]
        for thread in waiting:
            thread.join(max(0.0, finish_by - time.monotonic()))
        if not any(thread.is_alive() for thread in waiting):
            return True
        with self._resume_lock:
            gave_up, self._gave_up = self._gave_up, True
        if not gave_up and self.remediator is None:
            log.warning("stopping while the engine's tick is still running after %g s (one lease)", lease_s)
        elif not gave_up:
            log.warning("stopping while interrupted actions are still being resumed after %g s (one lease); another "
                        "server or engine takes them over once this process's lease on them lapses", lease_s)
        return False

    def _resume_logged(self) -> None:
        try:
            self._resume_interrupted()
        except Exception:  # the store briefly down: the runs stay started, for the next round
            log.exception("resuming interrupted actions failed; retrying at the next tick")

    # ---------------------------------------------------------------- one round

    def tick(self) -> TickReport:
        if not self._started:
            if not self.start(wait=False):  # standing by: run() tries again at its next tick
                return TickReport(standby=True)
        else:
            # LeaseLost: another engine took the lease since (this process stalled or was cut off from the store
            # past remedy_lease_s)
            self._progress()
            self.store.renew_lease(LEASE, self.owner, time.time() + self.lease_s)
            self._place_moved(running=True)
            self._resume_beside()
        began = time.perf_counter()
        report = TickReport()
        now = self.clock()
        if self.slurm is not None and now >= self._next_slurm:
            self._next_slurm = now + self.settings.slurm_poll_s
            self._read_slurm(now)
        if self.kube_jobs is not None and now >= self._next_kube:
            self._next_kube = now + self.settings.kube_jobs_poll_s
            self._read_kube_jobs()
        self._progress()
        self._refresh_topology()
        # rows remembered are not read again while unsettled, and none unsettled once the bound is reached
        events_at_bound = len(self.ahead_events) >= AHEAD_EVENTS
        push_bound = self.ahead_push_bound()
        pushes_at_bound = len(self.ahead_pushes) >= push_bound
        read_events = self.store.events_read(self.event_cursor, limit=self.batch, skip=self.ahead_events,
                                             settled_only=events_at_bound)
        read_pushes = self.store.pushes_read(self.push_cursor, limit=self.batch, skip=self.ahead_pushes,
                                             settled_only=pushes_at_bound)
        # copies, taken up once the tick's outputs and cursor are stored: a tick that fails judges its rows again
        ahead_events, ahead_pushes = set(self.ahead_events), set(self.ahead_pushes)
        events, event_cursor, events_full = _take([(p, e, s) for p, e, s in read_events], self.event_cursor,
                                                  ahead_events, AHEAD_EVENTS)
        pushes, push_cursor, pushes_full = _take([(p.position, p, s) for p, s in read_pushes], self.push_cursor,
                                                 ahead_pushes, push_bound)
        # a read full of rows remembered, still unsettled, or held back by the bound is no full read: what holds them
        # back is watched all the same
        moving_events = len(events) + sum(1 for p, _, s in read_events if s and p in self.ahead_events)
        moving_pushes = len(pushes) + sum(1 for p, s in read_pushes if s and p.position in self.ahead_pushes)
        events_full = events_full or (events_at_bound and len(ahead_events) >= AHEAD_EVENTS)
        pushes_full = pushes_full or (pushes_at_bound and len(ahead_pushes) >= push_bound)
        report.events, report.pushes = len(events), len(pushes)
        self._progress()
        for push in pushes:
            self._apply_push(push, now, report)
        if self.prom is not None:
            self._pull_prometheus(now)
        self._progress()
        self._detect(self.frames.frames(now), events, report)
        self._progress()
        self._publish(now, report)
        self._progress()
        self.event_cursor, self.push_cursor = event_cursor, push_cursor
        self.ahead_events, self.ahead_pushes = ahead_events, ahead_pushes
        self._save_cursor()
        if (events_full or pushes_full) and not self.ahead_full:
            log.warning("%d events (of %d) and %d metric pushes (of %d) committed while an older transaction still "
                        "runs on the PostgreSQL server were judged at once and remembered; the bound is reached, so "
                        "further ones wait, unread, until it ends (%s): they are judged late, at the tick after it "
                        "ends - the nodes whose pushes wait are judged on their last values read meanwhile - and, "
                        "the pushes remembered being in memory only, an engine restarted before then reads those "
                        "pushes again (applied again, they change no value held; the events' are kept in the "
                        "cursor and judged once); raise engine_read_ahead_pushes (memory: about 200 bytes a push) "
                        "or end the transaction", len(ahead_events), AHEAD_EVENTS, len(ahead_pushes), push_bound,
                        self.store.oldest_writer())
        self.ahead_full = events_full or pushes_full
        if moving_events < self.batch and moving_pushes < self.batch:
            self._watch_held_back(now)
        self._progress()
        self._prune(now)
        self.ticks += 1
        report.seconds = time.perf_counter() - began
        self.last_tick = report
        return report

    def _apply_push(self, push: MetricPush, now: float, report: TickReport) -> None:
        """A push into the live view, unless it is older than ``live_push_max_age_s`` (stored for the record, never
        judged live) or older than what the view holds of its series (``LiveFrames.apply``)."""
        if push.ts < now - self.settings.live_push_max_age_s:
            report.stale += 1
            self.stale_pushes += 1
            if push.ts > self.frames.newest(push.node):
                # the newest this node has sent, yet too old: its agent's backlog after an outage, or its clock
                self.push_offsets[push.node] = push.ts - now
                if push.node not in self._warned_stale:
                    self._warned_stale.add(push.node)
                    log.warning("a samples push of %s made %.0f s ago is older than live_push_max_age_s (%g s): "
                                "stored, not judged live (a backlog sent after an outage; if every push of the node "
                                "is, its clock is behind this server's; further ones counted in the engine's "
                                "stale_pushes, vigil_engine_stale_pushes_total)",
                                push.node, now - push.ts, self.settings.live_push_max_age_s)
            return
        # A node's pushes are ordered by their own stamps (its agent's clock), also those ahead of this server's: an
        # agent sending its newest push and then its backlog leaves the newest held. Only a newest held that is
        # itself implausible - more than the window ahead of now - gives way, to a push older than it by more than
        # the window (no backlog the window holds): the node's clock was far ahead and has been set back.
        window = self.settings.live_push_max_age_s
        held = self.frames.newest(push.node)
        if held > now + window and push.ts < held - window:
            self.frames.reset_times(push.node)
        newest = push.ts >= self.frames.newest(push.node)
        if self.frames.apply(push.node, push.points, push.ts):
            report.late += 1
            self.late_pushes += 1
        if newest:
            # the node's pushes are judged again: a later stale one is worth a warning again
            self._warned_stale.discard(push.node)
            self.push_offsets[push.node] = push.ts - now

    def _pull_prometheus(self, now: float) -> None:
        assert self.prom is not None
        metrics = sorted({m for family in ENTITY_FAMILIES for m in family_metrics(family)})
        by_node: dict[str, list[tuple[str, str, float]]] = defaultdict(list)
        for metric, entity, value, _ts in self.prom.samples(metrics, at=now):
            kind, parts = parse_entity(entity)
            by_node[parts[0] if kind in ("gpu", "nic", "node") else entity].append((metric, entity, value))
        for node, points in by_node.items():
            self.frames.apply(f"prometheus:{node}", points, now)

    def _read_slurm(self, now: float) -> None:
        """Slurm's jobs into the topology (rank -> GPU placement on the registered nodes); a job that failed
        becomes an event, read by this and every other engine through the event cursor."""
        assert self.slurm is not None
        try:
            collected = self.slurm.collect(now)
            running = [j for j in self.slurm.jobs() if j.state in ("RUNNING", "COMPLETING")]
        except VigilInputError as err:
            log.warning("reading Slurm failed: %s", err)
            return
        self._progress()
        self.store.add_events(collected.events)
        topology = self.store.topology() or Topology()
        self._set_jobs(topology, [placement(j, topology) for j in running], "slurm")

    def _read_kube_jobs(self) -> None:
        assert self.kube_jobs is not None
        topology = self.store.topology() or Topology()
        try:
            jobs = self.kube_jobs.jobs(topology)
        except Exception as err:  # the API server away for a moment must not stop detection
            log.warning("reading training pods from Kubernetes failed: %s", err)
            return
        self._set_jobs(topology, jobs, "kubernetes")

    def _set_jobs(self, topology: Topology, jobs: list[Job], source: str) -> None:
        """``source``'s jobs as it lists them now; jobs another source registered (a `vigil launch`) stay."""
        self._progress()
        mine = [job.model_copy(update={"source": source}) for job in jobs]
        kept = [job for job in topology.jobs if job.source != source and job.id not in {j.id for j in mine}]
        if kept + mine != topology.jobs:
            self.store.save_topology(topology.model_copy(update={"jobs": kept + mine}), source=source)

    def _detect(self, frames: list[MetricFrame], events: list[Event], report: TickReport) -> None:
        opened = self.detector.update(frames, events)
        for learned in list(self.learned):
            try:
                opened += learned.update(frames, events)
            except VigilInputError as err:
                # A model that cannot read this cluster's frames is set aside; the rules go on.
                log.error("learned detector %s set aside: %s", learned.name, err)
                self.learned.remove(learned)
        for anomaly in opened:
            # Named by what it is about, so a tick replayed after a crash finds the same anomaly.
            anomaly.id = anomaly_id_for(anomaly)
            self._anomalies[anomaly.id] = anomaly
        report.anomalies += len(opened)
        self.grouper.add(opened)
        for event in events:
            if event.kind == "job" and event.attrs.get("reason") in JOB_ENDED:
                # The job reports no more: its telemetry must not read as a stall from here on.
                self.frames.forget(event.entity)
                if event.attrs.get("reason") == "completed":
                    self.grouper.settle(event.entity)

    def _publish(self, now: float, report: TickReport) -> None:
        news: list[Incident] = []
        finished: set[str] = set()
        for incident in self.grouper.incidents(now):
            self._progress()
            known = self._known.get(incident.id)
            signature = self._signature(incident, now)
            if known is not None and known.status == IncidentStatus.ACKNOWLEDGED.value and (
                    incident.status is IncidentStatus.OPEN and known.anomalies == signature.anomalies):
                incident.status = IncidentStatus.ACKNOWLEDGED
                signature.status = known.status
            if known is not None and (known.anomalies, known.level, known.status) == (
                    signature.anomalies, signature.level, signature.status):
                if incident.end > known.end and now - known.written >= REWRITE_EVERY_S:
                    incident = self._keep_user_status(incident)
                    self._progress()
                    self.store.upsert_incident(incident)
                    known.end, known.written = incident.end, now
                continue
            incident = self._keep_user_status(incident)
            self._progress()
            signature.status = incident.status.value
            self.store.add_anomalies([self._anomalies[a] for a in incident.anomalies if a in self._anomalies])
            self.store.upsert_incident(incident)
            if known is None:
                report.opened.append(incident.id)
            elif incident.status is IncidentStatus.RESOLVED:
                report.resolved.append(incident.id)
            else:
                report.changed.append(incident.id)
            if incident.status is not IncidentStatus.RESOLVED and (
                    known is None or known.anomalies != signature.anomalies or known.level != signature.level):
                self._diagnose(incident)
                self._progress()
                report.actions += self._propose(incident, set(known.anomalies) if known else set())
            self._known[incident.id] = signature
            news.append(incident)
            if incident.status is IncidentStatus.RESOLVED:
                finished.add(incident.id)
                remember(self.store, incident)
        self._notify(news, now)
        if finished:
            self.grouper.forget(finished)
            for incident_id in finished:
                self._known.pop(incident_id, None)
                self._notified.pop(incident_id, None)
            live = {a for g in self.grouper.groups for a in (x.id for x in g.anomalies)}
            self._anomalies = {k: v for k, v in self._anomalies.items() if k in live}

    def _keep_user_status(self, incident: Incident) -> Incident:
        """A person's acknowledgement stands while the incident is open."""
        stored = self.store.incident(incident.id)
        acknowledged = stored is not None and stored.status is IncidentStatus.ACKNOWLEDGED
        if acknowledged and incident.status is IncidentStatus.OPEN:
            incident.status = IncidentStatus.ACKNOWLEDGED
        return incident

    @staticmethod
    def _signature(incident: Incident, now: float) -> _Known:
        return _Known(tuple(sorted(incident.anomalies)), int(incident.level), incident.status.value, incident.end, now)

    # ---------------------------------------------------------------- diagnosis and actions

    def _diagnose(self, incident: Incident) -> Diagnosis | None:
        if not self.topology.nodes:
            log.warning("incident %s: no topology registered yet; diagnosis waits for the agents' inventory",
                        incident.id)
            return None
        if self._kg is None:
            self._kg = KnowledgeGraph.build(self.topology)
        anomalies = [self._anomalies[a] for a in incident.anomalies if a in self._anomalies]
        lo, hi = incident.start - DIAGNOSIS_SLACK_S, incident.end + DIAGNOSIS_SLACK_S
        events = self.store.events(since=lo, until=hi, limit=100_000)
        logs = self.store.logs(since=lo, until=hi, limit=100_000)
        result = analyze_incident(self._kg, incident, anomalies, events, logs)
        self._progress()
        found = diagnose(self._kg, incident, result, self.llm)
        found.similar = recall(self.store, incident, found)
        self._progress()
        self.store.save_diagnosis(found)
        return found

    def _propose(self, incident: Incident, seen: set[str]) -> int:
        """The policies' actions for each anomaly new to the incident, as proposals (dry-run until approved)."""
        count = 0
        for anomaly_id in incident.anomalies:
            anomaly = self._anomalies.get(anomaly_id)
            if anomaly_id in seen or anomaly is None:
                continue
            for action in self.policies.plan(anomaly, incident.id):
                action.id = stable_id("act", incident.id, anomaly.id, action.kind.value, action.target)
                action.requested_by = "vigil-engine"
                if self.store.action(action.id) is None:
                    self.store.add_action(action)
                    count += 1
        return count

    # ---------------------------------------------------------------- alerts

    def _notify(self, news: list[Incident], now: float) -> None:
        """New, changed and resolved incidents now; open ones again before Alertmanager would time them out."""
        for notifier in self.notifiers:
            resend = getattr(notifier, "resend_s", float("inf"))
            due = {i.id: i for i in news}
            if resend != float("inf"):
                for incident_id, last in self._notified.items():
                    if incident_id not in due and now - last >= resend:
                        stored = self.store.incident(incident_id)
                        if stored is not None:
                            due[incident_id] = stored
            if not due:
                continue
            self._progress()
            try:
                notifier.send(list(due.values()), now)
            except Exception as err:  # a notifier down must not stop detection; the next tick retries
                log.warning("notifying %s failed: %s", notifier.name, err)
                continue
            for incident_id in due:
                self._notified[incident_id] = now

    # ---------------------------------------------------------------- bookkeeping

    def _refresh_topology(self) -> None:
        version = self.store.topology_version()
        if version == self.topology_version:
            return
        self.topology_version = version
        self.topology = self.store.topology() or Topology()
        self._kg = None
        self.detector.set_topology(self.topology)
        for learned in self.learned:
            learned.set_topology(self.topology)
        self.grouper.set_topology(self.topology)

    def _watch_held_back(self, now: float) -> None:
        """On PostgreSQL a row is read once every older transaction has ended (ReadPosition): Vigil's own writes last
        milliseconds, but a transaction left open on the same server - any database of it, any application - holds
        the engine's reads back for as long. One transaction holding rows back for ``HELD_BACK_WARN_S`` is warned of
        once, naming its session, and its end once more."""
        xmin = self.store.held_back(self.event_cursor, self.push_cursor)
        if xmin is None or xmin != self._held_by:
            if self._warned_held:
                log.warning("the transaction that held the engine's reads back has ended; what it held is read")
            self._held_by, self._warned_held = xmin, False
            self.held_since = None if xmin is None else now
            return
        if not self._warned_held and self.held_since is not None and now - self.held_since >= HELD_BACK_WARN_S:
            self._warned_held = True
            log.warning("the engine's read position has waited for %.0f s for an older transaction still running "
                        "on the PostgreSQL server: %s; rows committed since are judged at once and remembered (%d "
                        "events of %d, %d pushes of %d), past that they wait, unread, until it ends (the server's "
                        "idle_in_transaction_session_timeout ends idle ones)", now - self.held_since,
                        self.store.oldest_writer(), len(self.ahead_events), AHEAD_EVENTS, len(self.ahead_pushes),
                        self.ahead_push_bound())

    def ahead_push_bound(self) -> int:
        """How many pushes committed past an open transaction are judged at once and remembered (``_take``): setting
        engine_read_ahead_pushes, or with it 0 ``AHEAD_PUSHES_PER_NODE`` for every node that has pushed (its
        offset known), at least ``AHEAD_PUSHES``."""
        if self.settings.engine_read_ahead_pushes:
            return self.settings.engine_read_ahead_pushes
        return max(AHEAD_PUSHES, AHEAD_PUSHES_PER_NODE * len(self.push_offsets))

    def _save_cursor(self) -> None:
        self.store.set_cursor(CURSOR, float(self.event_cursor.id),
                              {"events": self.event_cursor.id, "events_xid": self.event_cursor.xid,
                               "pushes": self.push_cursor.id, "pushes_xid": self.push_cursor.xid,
                               "events_ahead": sorted([p.xid, p.id] for p in self.ahead_events),
                               "ticks": self.ticks + 1,
                               "at": self.clock(), "stale_pushes": self.stale_pushes,
                               "late_pushes": self.late_pushes, "push_offsets": self.push_offsets},
                              lease=(LEASE, self.owner, time.time() + self.lease_s))

    def _prune(self, now: float) -> None:
        """Keep the pushes read of the last ``live_push_max_age_s`` (what a restart replays, for counter baselines):
        drop at most one batch a tick of those read stamped before it, or more than it ahead of ``now`` (a clock far
        ahead: never replayed as new). Their keys are kept apart (``metric_push_keys``) for ``push_key_window_s``."""
        window = self.settings.live_push_max_age_s
        if self.push_cursor.id:
            self.pruned_pushes += self.store.prune_pushes_outside(self.push_cursor, now - window, now + window,
                                                                  limit=self.batch)

    def run(self) -> None:
        """Tick every ``engine_interval_s`` until ``stop`` is set, then let the round of resumed actions in flight end
        (``finish_resuming``); a failing tick is logged and retried. Ended by an exception (Ctrl-C's KeyboardInterrupt
        in its wait), ``stop`` is set all the same, so the round in flight claims no further run while the caller
        waits for it."""
        try:
            while not self.stop.is_set():
                began = time.monotonic()
                self._mark()
                self._round()
                self.stop.wait(max(0.0, self.settings.engine_interval_s - (time.monotonic() - began)))
        except BaseException:
            self.stop.set()
            raise
        self.finish_resuming()
        self.release()

    def _round(self) -> None:
        """One tick of ``run``: a failing tick is logged and retried; one that finds the lease lost (another engine
        judges the store now, this one's state is stale) ends the loop, or with ``stand_by_on_loss`` drops that state
        and stands by again, to take over once the other's lease lapses."""
        try:
            self.tick()
        except LeaseLost as err:
            self._stop_keeping()
            if not self.stand_by_on_loss:
                log.error("this engine stops: %s - it stalled or lost the store past remedy_lease_s (%g s) and "
                          "another engine took over, reading on from the cursor this one last saved", err,
                          self.lease_s)
                raise
            log.error("this engine stops judging and stands by again: %s - it stalled or lost the store past "
                      "remedy_lease_s (%g s) and another engine took over, reading on from the cursor this one last "
                      "saved", err, self.lease_s)
            self._stand_by_again()
        except Exception:  # one bad tick (store briefly down) must not end the loop
            log.exception("engine tick failed; retrying")

    def _stand_by_again(self) -> None:
        """Drop what this engine judged from (frames, incidents, cursors, the topology...) as at construction, keeping
        its stop event, its owner and the round of resumed actions in flight: its next tick stands by, and once it
        takes the lease again it reads it all from the store as a start does."""
        keep = {"stop", "owner", "stand_by_on_loss", "resumed_actions", "_resuming", "_resume_lock", "_finish_by",
                "_gave_up"}
        fresh = Engine(self.store, self.settings, prom=self.prom, notifiers=self.notifiers, clock=self.clock,
                       batch=self.batch, kube_jobs=self.kube_jobs, remediator=self.remediator)
        for name, value in vars(fresh).items():
            if name not in keep:
                setattr(self, name, value)

    def status(self) -> dict[str, Any]:
        last = self.last_tick
        return {
            "ticks": self.ticks,
            "standing_by_for": self.standing_by,
            "event_cursor": self.event_cursor.id,
            "push_cursor": self.push_cursor.id,
            "held_back_s": None if self.held_since is None else round(self.clock() - self.held_since, 1),
            "read_ahead": {"events": len(self.ahead_events), "pushes": len(self.ahead_pushes),
                           "full": self.ahead_full},
            "read_ahead_bound": {"events": AHEAD_EVENTS, "pushes": self.ahead_push_bound()},
            "stale_pushes": self.stale_pushes,
            "late_pushes": self.late_pushes,
            "pruned_pushes": self.pruned_pushes,
            "topology_version": self.topology_version,
            "open_incidents": len(self._known),
            "detectors": [self.detector.name, *(d.name for d in self.learned)],
            "last_tick_s": last.seconds if last else None,
        }


# this process's token in its engine owner (``engine_owner``): drawn once, so every engine of the process shares it
_TOKEN = secrets.token_hex(8)


def engine_owner(token: str = _TOKEN) -> str:
    """An engine's owner of the lease: ``HOST pid:[NS]:PID:TOKEN`` - this host's name and pid namespace as the commands'
    records give them (``vigil.remedy.commands.this_host``), the pid, and a token drawn once per process. Two
    containers with one hostname and the same pid (each its own pid namespace) are two owners, and a process that
    reuses an ended engine's pid (same host and namespace) is another owner, which cannot renew that one's lease.
    `vigil serve`'s claims on diagnoses are named the same way, each worker with a ``token`` of its own."""
    return f"{this_host()}:{os.getpid()}:{token}"


def _process_gone(owner: str) -> bool:
    """Whether the engine ``owner`` (``engine_owner``) was a process of this host and pid namespace that has ended (or
    a zombie, killed and not yet reaped): its lease is taken at once, not after it lapses. An owner of another host or
    pid namespace, or of an older release (``HOST:PID``, no namespace), is never gone: its lease lapses."""
    where, pid, token = (owner.rsplit(":", 2) + ["", ""])[:3]
    if where != this_host() or where.endswith(" pid:?") or not pid.isdigit() or not token:
        return False  # another host or namespace, or a namespace unknown (no /proc: two such would read alike)
    if int(pid) == os.getpid():
        return token != _TOKEN  # this pid's earlier process (it ended: its pid is this one's now)
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def load_topology_file(path: Path) -> Topology:
    """A topology file (YAML or JSON: cluster, nodes with rack / switch / labels, switches)."""
    data = read_yaml(path, "topology file")
    if not isinstance(data, dict):
        raise VigilInputError(f"topology file {path}: expected a mapping with 'nodes' (and 'switches')")
    topology: Topology = Topology.from_dict(data)
    return topology


def notifiers_from(settings: Settings) -> list[Notifier]:
    out: list[Notifier] = []
    if settings.alertmanager_url:
        out.append(AlertmanagerNotifier(settings.alertmanager_url, settings.external_url,
                                        resend_s=settings.alert_resend_s))
    if settings.alert_webhook_url:
        out.append(WebhookNotifier(settings.alert_webhook_url, settings.external_url))
    return out


def start_in_thread(engine: Engine) -> threading.Thread:
    thread = threading.Thread(target=engine.run, name="vigil-engine", daemon=True)
    thread.start()
    return thread


def stop_in_thread(engine: Engine, thread: threading.Thread) -> bool:
    """Stop an engine ``start_in_thread`` runs on ``thread`` (`vigil serve` shutting down): no tick after the one in
    flight, which is waited for with the round of resumed actions in flight as ``Engine.finish_resuming`` waits -
    both threads are daemons, and the process would end mid-drain."""
    engine.stop.set()
    return engine.finish_resuming(loop=thread)


def _take(rows: list[tuple[ReadPosition, _T, bool]], cursor: ReadPosition, ahead: set[ReadPosition],
          bound: int) -> tuple[list[_T], ReadPosition, bool]:
    """What a tick judges of the rows read after ``cursor`` (``Store.events_read``: in read order, the settled ones
    first), the position it reads on from, and whether ``bound`` held a row back. A settled row moves the position
    on; one committed past an older transaction still running is judged now, unless judged already, and its position
    remembered in ``ahead`` (at most ``bound``; past it the row waits for that transaction, read again then), so the
    read once it has ended, which starts at the position again, does not judge it twice. ``ahead`` keeps only the
    positions past the one returned."""
    taken: list[_T] = []
    full = False
    # the remembered positions this call passes, forgotten at its end, take no room
    last_settled = max((position for position, _, settled in rows if settled), default=cursor)
    passed = sum(1 for p in ahead if p <= last_settled)
    for position, item, settled in rows:
        if settled:
            cursor = position
        if position in ahead:
            continue
        if not settled:
            if len(ahead) - passed >= bound:
                full = True
                continue
            ahead.add(position)
        taken.append(item)
    ahead.difference_update([p for p in ahead if p <= cursor])
    return taken, cursor, full
