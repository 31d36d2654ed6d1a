"""The node agent: reads every source on its own interval, survives a hung source, degrades under load.

Collection practice (the production clusters' rules this loop follows):

- **Per-kind sampling intervals**: each source has a metric kind (gpu, network, host, kernel, kube, rank_log) whose
  interval is configurable (``VIGIL_AGENT_INTERVALS='{"gpu": 10, "network": 30}'`` or ``--interval``).
- **Per-source timeouts**: a read runs in its own daemon thread; past its timeout the source is marked down
  (``vigil_agent_source_up{source=...} 0``, its stale points withdrawn) and not started again until the stuck
  read returns, so a hung driver call holds at most one thread and never the loop.
- **Dynamic degradation**: when the node's CPU stays above 80% the agent samples - periodic sources run at
  ``degraded_factor`` times their interval - and says so (a warning, ``vigil_agent_degraded 1``); below 70%
  it returns to full rate. The kernel log keeps its rate: events are rare, cheap and the ones that matter.
- **Label hygiene**: ``LabelGuard`` refuses labels that name changing states or unbounded ids and folds pod
  names to their workload and runaway label values to ``other``, warning once per metric and label.

What it collects is exposed for Prometheus (``/metrics`` on ``port``) and events are pushed to the Vigil
server (``POST <server>/api/v1/events``) when one is configured; the training ranks' decoded log lines
(``rank_logs``, ``vigil.sources.collect.rank_files``) go to ``POST <server>/api/v1/rank-logs``, which takes them
only for ranks placed on this node. Events wait for the server in a bounded queue, spooled to disk
(``state_dir``, ``vigil.sources.collect.spool``) so that a restarted agent sends them first; what it cannot hold,
and a batch the server refuses for good (``refused_for_good``), is counted (``vigil_agent_events_dropped_total``);
a refused token (401 / 403) keeps everything. Samples pushes the server has not taken wait in a backlog bounded by
count, bytes and age (``samples_backlog_*``) and are sent again after each round's own push, oldest first and a few a
round, each under its own Idempotency-Key (``EventPusher``); the ones it cannot hold are counted
(``vigil_agent_samples_pushes_dropped_total``). Each push is written to the spool (its samples table) before it is
first sent and removed once it leaves the backlog, so that a restarted agent sends what it had not delivered - the
push in flight when it was killed included.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import sqlite3
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import httpx
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from vigil.model import Event, FaultLevel, Gpu, Nic, Node, Sample, VigilInputError, parse_entity
from vigil.sources.collect.base import Collection, Point, Source, default_node_name
from vigil.sources.collect.dcgm import DcgmExporterScraper
from vigil.sources.collect.host import CpuMeter, HostCollector
from vigil.sources.collect.infiniband import InfinibandCollector
from vigil.sources.collect.kmsg import KernelLogSource, stable_boot_time
from vigil.sources.collect.kube import KubernetesSource, in_cluster
from vigil.sources.collect.local_store import AgentStore
from vigil.sources.collect.nvml import NvmlCollector
from vigil.sources.collect.rank_files import RankLogFiles, RankLogSource
from vigil.sources.collect.spool import EventSpool, SpoolQueue, SpoolUnavailable
from vigil.store.retention import RetentionPolicy

log = logging.getLogger("vigil.agent")

DEFAULT_INTERVALS: dict[str, float] = {
    "gpu": 10.0,
    "network": 30.0,
    "host": 15.0,
    "kernel": 5.0,
    "kube": 30.0,
    "rank_log": 5.0,
}
# Events kept for the server while it is away; older ones are dropped (and counted) beyond it.
MAX_PENDING_EVENTS = 10_000
# The errors a server's 422 describes at most (vigil.faces.api.app.MAX_LISTED_ERRORS): fewer described are all.
SERVER_MAX_LISTED_ERRORS = 20
# Where the agent keeps what must outlive it (the events spool, vigil.sources.collect.spool): the systemd unit's
# StateDirectory and the DaemonSet's hostPath.
DEFAULT_STATE_DIR = "/var/lib/vigil-agent"
# Why events were dropped unsent (vigil_agent_events_dropped_total{reason}): the spool on disk at its bounds.
SPOOL_FULL = "spool_full"
# Why the server refuses one event of a rank-log push (``POST /api/v1/rank-logs`` answers them per event); the
# agent counts its refused events by these, a whole push refused (HTTP 4xx, see refused_for_good) as PUSH_REFUSED
# and a reason it does not know as "other".
NOT_RANK_LOG = "not_rank_log"
RANK_ON_ANOTHER_NODE = "rank_on_another_node"
RANK_OUTSIDE_JOB = "rank_outside_job"
PUSH_REFUSED = "push_refused"
RANK_LOG_REFUSALS = (NOT_RANK_LOG, RANK_ON_ANOTHER_NODE, RANK_OUTSIDE_JOB, PUSH_REFUSED, "other")
# The header naming a samples push, so that the server stores a push sent again once (``POST /api/v1/samples``).
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
# HTTP 4xx answers that refuse a push for now, not for good (Request Timeout, Too Early, Too Many Requests - a
# proxy's or gateway's rate limit): the push is kept and sent again, as after a server error.
SEND_AGAIN_STATUSES = frozenset({408, 425, 429})
# HTTP 4xx answers that refuse the agent's token, not its data (Unauthorized: a wrong or rotated token; Forbidden: a
# token without the operator role, or a server with no token set): everything is kept for when the token is put
# right, in the bounded queue and backlog, and the agent says so once an episode.
TOKEN_REFUSED_STATUSES = frozenset({401, 403})
# HTTP 4xx answers on Vigil's own routes that say the request went to the wrong place, not that its data is bad (Not
# Found, Misdirected Request: an ingress mid-rollout, a wrong path prefix): everything is kept, in the bounded queue
# and backlog, and sent again, with one warning an episode.
MISROUTED_STATUSES = frozenset({404, 421})
# The events route's answer to a body too large (a proxy's body limit, nginx's 1 MiB by default): the batch is split
# in half and each half sent again, down to one event.
TOO_LARGE = 413
# Why an unanswered samples push left the agent's backlog unsent (``vigil_agent_samples_pushes_dropped_total``):
# pushed out by newer ones (the backlog at its count or byte limit), older than the backlog's age limit, or refused by
# the server (HTTP 4xx but SEND_AGAIN_STATUSES and TOKEN_REFUSED_STATUSES).
BACKLOG_FULL = "backlog_full"
EXPIRED = "expired"
REFUSED = "refused"
SAMPLES_DROP_REASONS = (BACKLOG_FULL, EXPIRED, REFUSED)


def refused_for_good(status: int) -> bool:
    """Whether an HTTP answer refuses what was pushed for good (sending it again cannot help): a 4xx but the ones
    that refuse it for now (SEND_AGAIN_STATUSES) or refuse the agent's token (TOKEN_REFUSED_STATUSES)."""
    return (400 <= status < 500 and status not in SEND_AGAIN_STATUSES and status not in TOKEN_REFUSED_STATUSES
            and status not in MISROUTED_STATUSES)


# The server's defaults the samples backlog is sized by (vigil.config.Settings; the agent does not read the server's
# settings): its engine judges live only a push younger than live_push_max_age_s, and it knows a push's key for
# push_key_window_s. A push sent again must reach the server well inside that window, or one the server stored and
# answered into the void is stored twice: the backlog's age limit stays at least KEY_WINDOW_MARGIN_S below it (a
# request's timeout, a round run late, the server's clock stepped).
SERVER_LIVE_PUSH_MAX_AGE_S = 300.0
SERVER_PUSH_KEY_WINDOW_S = 3600.0
KEY_WINDOW_MARGIN_S = 300.0

# Kinds read at full rate even while degraded: event streams, not periodic samples.
FULL_RATE_KINDS = frozenset({"kernel"})


class AgentSettings(BaseSettings):
    """The agent's settings, from VIGIL_AGENT_* environment variables and the command line."""

    model_config = SettingsConfigDict(env_prefix="VIGIL_AGENT_", extra="ignore")

    node: str = Field(default="", description="node name; empty = NODE_NAME or the hostname")
    intervals: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_INTERVALS))
    timeout_s: float = Field(default=5.0, gt=0, description="longest a single read of a source may take")
    cpu_high: float = Field(default=0.80, gt=0, le=1, description="node CPU ratio that starts sampling")
    cpu_low: float = Field(default=0.70, gt=0, le=1, description="node CPU ratio that ends sampling")
    load_check_s: float = Field(default=5.0, gt=0)
    degraded_factor: float = Field(default=4.0, ge=1)
    port: int = Field(default=9402, ge=0, le=65535, description="Prometheus exposition port; 0 = off")
    dcgm_url: str = Field(default="http://localhost:9400/metrics", description="dcgm-exporter; empty = off")
    server_url: str = Field(default="", description="Vigil server to push events to; empty = off")
    server_token: str = Field(default="", description="bearer token for the server (its api_token)")
    labels: dict[str, str] = Field(default_factory=dict, description="node labels sent with the inventory "
                                   "(topology.vigil.io/rack, topology.vigil.io/leaf place it in the fabric)")
    push_interval_s: float = Field(default=15.0, gt=0)
    events_batch_bytes: int = Field(default=512 * 1024, ge=1024, description="most bytes of one events POST; the "
                                    "queue goes in several POSTs a round (half nginx's default 1 MiB body limit)")
    events_batch_max: int = Field(default=1000, ge=1, le=10_000, description="most events in one events POST (the "
                                  "server takes at most 10,000 a POST)")
    push_samples: bool = Field(default=True, description="push metric samples too (off where Prometheus scrapes "
                               "the agent and the engine reads PromQL)")
    samples_backlog_pushes: int = Field(default=24, ge=1, description="samples pushes kept while the server does "
                                        "not answer, the oldest dropped beyond (24: the age limit's 300 s of 15 s "
                                        "pushes and a few rounds run late)")
    samples_backlog_bytes: int = Field(default=4 * 2**20, ge=1, description="bytes of samples pushes kept while the "
                                       "server does not answer, the oldest dropped beyond (the newest is always kept)")
    samples_backlog_age_s: float = Field(default=SERVER_LIVE_PUSH_MAX_AGE_S, gt=0,
                                         le=SERVER_PUSH_KEY_WINDOW_S - KEY_WINDOW_MARGIN_S,
                                         description="an unanswered samples push older than this is dropped, not "
                                         "sent: the server's engine judges live only a push younger than its "
                                         "live_push_max_age_s (300 s) and stores an older one for nothing; at most "
                                         "the server's push_key_window_s (3600 s) less 300 s, since a push sent "
                                         "after its key was pruned may be stored twice")
    samples_backlog_per_round: int = Field(default=20, ge=0, description="waiting samples pushes sent at most in "
                                           "one push round, after the round's own (0: all): a full default backlog of "
                                           "24 goes in 2 rounds, not all at once from every node")
    state_dir: str = Field(default=DEFAULT_STATE_DIR, description="directory of what outlives the agent: the "
                           "events not yet answered by the server and the samples pushes it has not taken "
                           "(events-spool.sqlite), sent first when the agent starts again; empty = in memory only")
    spool_events: int = Field(default=MAX_PENDING_EVENTS, ge=1, description="most events kept in the spool, the "
                              "oldest dropped beyond (counted as spool_full)")
    spool_bytes: int = Field(default=32 * 2**20, ge=1024, description="most bytes of events (as JSON) kept in the "
                             "spool, the oldest dropped beyond (counted as spool_full)")
    kmsg_file: str = Field(default="", description="read this kernel log file instead of /dev/kmsg")
    rank_logs: list[RankLogFiles] = Field(default_factory=list, description="training ranks' log files to forward "
                                          "(glob, pattern naming job and rank); empty = none")
    max_label_values: int = Field(default=64, ge=1)
    store: str = Field(default="", description="directory of the agent's embedded history; empty = none")
    record_interval_s: float = Field(default=10.0, gt=0, description="how often latest values become a frame")
    raw_retention_s: float = Field(default=24 * 3600.0, gt=0)
    aggregate_retention_s: float = Field(default=30 * 86400.0, gt=0)
    aggregate_step_s: float = Field(default=300.0, gt=0)
    retention_every_s: float = Field(default=3600.0, gt=0, description="how often the downsampling job runs")


# --------------------------------------------------------------------------- label hygiene

# Label names whose values are changing states or unbounded ids: never a label (Prometheus naming guide;
# dcgm-exporter's err_msg and pod uid are the usual offenders).
REFUSED_LABELS = frozenset(
    {
        "err_msg",
        "message",
        "msg",
        "state",
        "status",
        "reason",
        "uid",
        "pod_uid",
        "container_id",
        "instance_id",
        "run_id",
        "step",
        "trace_id",
        "span_id",
        "request_id",
        "timestamp",
        "pid",
    }
)
POD_LABELS = frozenset({"pod", "pod_name", "exported_pod"})
# Kubernetes' generated-name alphabet (no vowels, no 0/1/3): ReplicaSet hash and pod suffix.
_K8S_ALNUM = "bcdfghjklmnpqrstvwxz2456789"
_POD_SUFFIX = re.compile(rf"(?:-[{_K8S_ALNUM}]{{6,10}})?-[{_K8S_ALNUM}]{{5}}$")
FOLDED = "other"


class LabelGuard:
    """Keeps label cardinality bounded: refuse state-like labels, fold pod names, cap distinct values."""

    def __init__(self, max_values: int = 64, refused: Iterable[str] = REFUSED_LABELS) -> None:
        self.max_values = max_values
        self.refused = frozenset(refused)
        self._values: dict[tuple[str, str], set[str]] = defaultdict(set)
        self._warned: set[tuple[str, str, str]] = set()
        self.refused_count = 0
        self.folded_count = 0

    def _warn(self, metric: str, label: str, what: str) -> None:
        if (metric, label, what) not in self._warned:
            self._warned.add((metric, label, what))
            log.warning("label hygiene: %s label %r of %s (further cases counted, not logged)", what, label, metric)

    def clean(self, metric: str, labels: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        kept = []
        for name, value in labels:
            if name in self.refused:
                self.refused_count += 1
                self._warn(metric, name, "refused")
                continue
            if name in POD_LABELS:
                workload = _POD_SUFFIX.sub("", value)
                if workload != value:
                    self.folded_count += 1
                    self._warn(metric, name, "folded pod name to its workload in")
                    value = workload
            seen = self._values[(metric, name)]
            if value not in seen:
                if len(seen) >= self.max_values:
                    self.folded_count += 1
                    self._warn(metric, name, f"more than {self.max_values} values: folded to {FOLDED!r}")
                    value = FOLDED
                else:
                    seen.add(value)
            kept.append((name, value))
        return tuple(kept)


# --------------------------------------------------------------------------- per-source scheduling


@dataclass
class SourceRunner:
    """One source, its schedule and the thread of its current read."""

    source: Source
    interval_s: float
    timeout_s: float
    next_due: float = 0.0
    thread: threading.Thread | None = None
    started: float = 0.0
    finished: float = 0.0
    result: Collection | None = None
    error: BaseException | None = None
    up: bool = True
    status: str = "not read yet"
    reads: int = 0
    timeouts: int = 0
    failures: int = 0
    last_duration_s: float = 0.0
    timed_out: bool = False
    points: list[Point] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    @property
    def unharvested(self) -> bool:
        """A read finished and not taken yet: a new read would overwrite it (and lose its events)."""
        with self._lock:
            return self.result is not None or self.error is not None

    def start(self, now: float) -> None:
        self.started = time.monotonic()
        self.timed_out = False
        self.thread = threading.Thread(target=self._read, args=(now,), name=f"vigil-agent-{self.name}", daemon=True)
        self.thread.start()

    def _read(self, now: float) -> None:
        try:
            result = self.source.collect(now)
        except Exception as err:  # a source bug must not kill the agent; it is counted and shown
            with self._lock:
                self.error, self.finished = err, time.monotonic()
            return
        with self._lock:
            self.result, self.finished = result, time.monotonic()

    def take(self) -> tuple[Collection | None, BaseException | None]:
        with self._lock:
            result, error = self.result, self.error
            self.result, self.error = None, None
        return result, error


class Agent:
    """Runs the sources; ``collect_once`` for one pass, ``run`` for the loop."""

    def __init__(
        self,
        sources: list[Source],
        settings: AgentSettings | None = None,
        cpu_ratio: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings or AgentSettings()
        self.node = self.settings.node or default_node_name()
        self.clock = clock
        self.guard = LabelGuard(self.settings.max_label_values)
        self.runners = [
            SourceRunner(
                s,
                self.settings.intervals.get(s.kind, DEFAULT_INTERVALS.get(s.kind, 15.0)),
                self.settings.timeout_s,
            )
            for s in sources
        ]
        if cpu_ratio is None:
            cpu_ratio = CpuMeter().ratio
        self._cpu_ratio = cpu_ratio
        self.cpu_last = 0.0
        self.degraded = False
        self.degradations = 0
        self._next_load_check = 0.0
        self.pending_events: list[Event] = []
        self.events_total: dict[tuple[str, str], int] = defaultdict(int)
        self.events_dropped = 0
        self.events_spool_dropped = 0  # events dropped from the full spool (and the queue): SPOOL_FULL
        self._lock = threading.Lock()
        # the spool's id of each event held in it, by the event object's id (the event kept alive with it), and the
        # events the full spool dropped while the push thread was sending them (not queued again if they fail)
        self.spool: EventSpool | None = None
        self._spooled: dict[int, tuple[Event, int]] = {}
        self._evicted: dict[int, Event] = {}
        self._spool_full_warned = False
        self.spool_failures = 0  # spool writes that failed (a full disk): their events were kept in memory only
        self._spool_failing = False  # in an episode of failed spool writes: warned once, until one succeeds
        self._unremoved: set[int] = set()  # spool rows of answered events whose removal failed, removed next time
        self.stop_event = threading.Event()
        self._pusher: EventPusher | None = None
        if self.settings.server_url:
            self._pusher = EventPusher(self.settings.server_url, self.settings.server_token,
                                       backlog_pushes=self.settings.samples_backlog_pushes,
                                       backlog_bytes=self.settings.samples_backlog_bytes,
                                       backlog_age_s=self.settings.samples_backlog_age_s,
                                       backlog_per_round=self.settings.samples_backlog_per_round,
                                       events_batch_bytes=self.settings.events_batch_bytes,
                                       events_batch_max=self.settings.events_batch_max)
            if self.settings.state_dir:
                self._open_spool(Path(self.settings.state_dir))
        self._next_push = 0.0
        self.store: AgentStore | None = None
        self._next_record = 0.0
        if self.settings.store:
            policy = RetentionPolicy(
                self.settings.raw_retention_s, self.settings.aggregate_retention_s, self.settings.aggregate_step_s
            )
            self.store = AgentStore(Path(self.settings.store), policy, self.settings.retention_every_s)

    # ---------------------------------------------------------------- one pass

    def collect_once(self, wait_s: float | None = None) -> None:
        """Start every source now and wait for each up to its timeout (a hung one is left behind)."""
        now = self.clock()
        for runner in self.runners:
            if not runner.busy:
                runner.start(now)
        deadline = time.monotonic() + (self.settings.timeout_s if wait_s is None else wait_s)
        for runner in self.runners:
            if runner.thread is not None:
                runner.thread.join(max(0.0, deadline - time.monotonic()))
        self.harvest(waited=True)

    # ---------------------------------------------------------------- the loop pieces

    def effective_interval(self, runner: SourceRunner) -> float:
        if self.degraded and runner.source.kind not in FULL_RATE_KINDS:
            return runner.interval_s * self.settings.degraded_factor
        return runner.interval_s

    def check_load(self, mono: float) -> None:
        """Enter sampling above cpu_high, leave it below cpu_low (hysteresis avoids flapping)."""
        if mono < self._next_load_check:
            return
        self._next_load_check = mono + self.settings.load_check_s
        self.cpu_last = self._cpu_ratio()
        if not self.degraded and self.cpu_last > self.settings.cpu_high:
            self.degraded = True
            self.degradations += 1
            log.warning(
                "node CPU at %.0f%% > %.0f%%: sampling, periodic sources read every %gx their interval",
                self.cpu_last * 100,
                self.settings.cpu_high * 100,
                self.settings.degraded_factor,
            )
        elif self.degraded and self.cpu_last < self.settings.cpu_low:
            self.degraded = False
            log.warning(
                "node CPU at %.0f%% < %.0f%%: back to full-rate collection",
                self.cpu_last * 100,
                self.settings.cpu_low * 100,
            )

    def schedule(self, mono: float) -> None:
        """Start every source that is due and not still busy with its previous read."""
        now = self.clock()
        for runner in self.runners:
            # a read that finished since the last harvest is taken first; the next starts at the next turn
            if mono >= runner.next_due and not runner.busy and not runner.unharvested:
                runner.start(now)
                runner.next_due = mono + self.effective_interval(runner)

    def harvest(self, waited: bool = False) -> None:
        """Collect finished reads, mark reads past their timeout (or still busy after ``waited``) as hung."""
        mono = time.monotonic()
        for runner in self.runners:
            result, error = runner.take()
            if result is not None or error is not None:
                runner.reads += 1
                runner.last_duration_s = runner.finished - runner.started
                runner.up = error is None and result is not None and result.up
            if error is not None:
                runner.failures += 1
                runner.status = f"failed: {type(error).__name__}: {error}"
                runner.points = []
                runner.source.problems.report("read failed", f"{type(error).__name__}: {error}")
            elif result is not None:
                runner.status = result.status
                runner.points = [self._clean(p) for p in result.points]
                self._accept_events(result.events)
            elif runner.busy and not runner.timed_out and (waited or mono - runner.started > runner.timeout_s):
                runner.timed_out = True
                runner.timeouts += 1
                runner.up = False
                runner.points = []
                runner.status = f"hung: no answer after {runner.timeout_s:g}s"
                runner.source.problems.report("timeout", f"read took longer than {runner.timeout_s:g}s")

    def _clean(self, point: Point) -> Point:
        if not point.labels:
            return point
        return Point(point.metric, point.entity, point.value, self.guard.clean(point.metric, point.labels))

    def _open_spool(self, directory: Path) -> None:
        """Open the events spool and queue what it holds (an agent stopped or crashed with events unsent) first."""
        try:
            self.spool = EventSpool(directory, self.settings.spool_events, self.settings.spool_bytes)
            held = self.spool.load()
            if self._pusher is not None:
                self._pusher.attach_spool(self.spool.samples(self.settings.samples_backlog_pushes,
                                                             self.settings.samples_backlog_bytes))
        except (SpoolUnavailable, OSError, sqlite3.Error) as err:
            if self.spool is not None:
                self.spool.close()
                self.spool = None
            log.warning("no events spool (%s): events not yet sent are lost if the agent stops; set "
                        "VIGIL_AGENT_STATE_DIR (--state-dir) to a writable directory", err)
            return
        for row_id, event in held:
            self._spooled[id(event)] = (event, row_id)
        self.pending_events = [event for _, event in held]
        if held:
            log.warning("sending first the %d event(s) the spool %s held from before this start", len(held),
                        self.spool.path)
        self._bound_pending()
        self.take_over()

    def take_over(self) -> None:
        """Take over the spool files of the state directory no agent holds - another agent's, stopped or killed
        while this one ran beside it (a rollout's surge, a restart overlapping), or one this agent's earlier run
        had of its own: their events are queued first and their samples pushes join the backlog, written to this
        agent's spool before the file is removed (a crash between the two sends them again, stored once). At start
        and before each push round; a look finding nothing costs a directory listing."""
        if self.spool is None:
            return
        try:
            for orphan in self.spool.orphans():
                try:
                    bodies = orphan.rows("events")
                    pushes = orphan.rows("samples", ("key", "made"))
                except sqlite3.OperationalError as err:  # locked, a disk failing: read again at the next look
                    orphan.leave(err)
                    continue
                except sqlite3.DatabaseError as err:  # damaged past what opening it checks
                    orphan.set_aside(err)
                    continue
                events: list[Event] = []
                for _, body in bodies:
                    try:
                        events.append(Event.model_validate(json.loads(body)))
                    except (ValueError, RecursionError, ValidationError):
                        self.spool.unreadable += 1
                with self._lock:
                    try:
                        dropped = self._spool_add(events, strict=True)
                    except (OSError, sqlite3.Error) as err:
                        orphan.leave(err)
                        return
                    self.pending_events[:0] = [e for e in events if id(e) not in dropped]
                    self._bound_pending()
                if self._pusher is not None and pushes:
                    self._pusher.adopt(pushes)  # a failing write keeps them in memory, warned as ever
                orphan.discard()
                log.warning("took over the spool %s another agent left: %d event(s) and %d samples push(es), sent "
                            "from this agent's spool %s", orphan.path, len(events), len(pushes), self.spool.path)
        except (OSError, sqlite3.Error) as err:
            log.warning("cannot look for spools other agents left in %s (%s)", self.spool.directory, err)

    def _spool_add(self, events: list[Event], strict: bool = False) -> set[int]:
        """Write new events to the spool before they are queued, and drop the events its bounds push out: from the
        queue, or marked for the push thread sending them. Returns the dropped events' object ids; ``strict``: a
        failed write raises (after it is counted). Lock held."""
        if self.spool is None or not events:
            return set()
        try:
            ids, evicted = self.spool.add(events)
        except (OSError, sqlite3.Error) as err:  # a full disk: the events are still queued in memory
            if strict:
                self.spool_failures += 1
                raise
            self.spool_failures += 1
            if not self._spool_failing:  # once an episode: a full disk fails every read's write
                self._spool_failing = True
                log.warning("the events spool %s failed (%s): events are queued in memory only until it takes a "
                            "write again (lost if the agent stops meanwhile; counted in "
                            "vigil_agent_events_spool_failures_total)", self.spool.path, err)
            return set()
        if self._spool_failing:
            self._spool_failing = False
            log.warning("the events spool %s takes writes again", self.spool.path)
        for event, row_id in zip(events, ids, strict=True):
            self._spooled[id(event)] = (event, row_id)
        if not evicted:
            return set()
        gone = set(evicted)
        self._unremoved -= gone
        dropped = {key for key, (_, row_id) in self._spooled.items() if row_id in gone}
        here = {id(e) for e in self.pending_events} | {id(e) for e in events}
        for key in dropped:
            event, _ = self._spooled.pop(key)
            if key not in here:
                self._evicted[key] = event  # in flight: dropped if it comes back unsent
        self.pending_events = [e for e in self.pending_events if id(e) not in dropped]
        # rows of events the server answered for whose removal failed (a full disk) were not dropped unsent
        self.events_spool_dropped += len(dropped)
        if not dropped:
            return set()
        if not self._spool_full_warned:
            self._spool_full_warned = True
            log.warning("the events spool %s is full (%d events, %d bytes): the oldest events are dropped (counted "
                        "in vigil_agent_events_dropped_total{reason=\"spool_full\"}, not logged)", self.spool.path,
                        self.spool.max_events, self.spool.max_bytes)
        return dropped

    def _spool_forget(self, events: Iterable[Event]) -> None:
        """Remove events from the spool: the server answered for them, or they were dropped. Lock held."""
        ids = [entry[1] for e in events if (entry := self._spooled.pop(id(e), None)) is not None]
        for event in events:
            self._evicted.pop(id(event), None)
        if self.spool is not None and (ids or self._unremoved):
            ids += self._unremoved  # rows a failed removal left: removed with these
            try:
                self.spool.remove(ids)
                self._unremoved = set()
                if not len(self.spool):
                    self._spool_full_warned = False  # the episode is over
            except (OSError, sqlite3.Error) as err:  # tried again at the next removal; sent again after a restart
                self.spool_failures += 1
                self._unremoved = set(ids)
                log.warning("the events spool %s failed (%s) removing %d answered event(s); tried again with the "
                            "next", self.spool.path, err, len(ids))

    def _settled(self, events: list[Event]) -> None:
        """The push thread's word on events the server answered for (taken or refused for good)."""
        with self._lock:
            self._spool_forget(events)

    def _accept_events(self, events: list[Event]) -> None:
        with self._lock:
            dropped = self._spool_add(events) if self._pusher is not None else set()
            for event in events:
                self.events_total[(event.kind, event.level.label)] += 1
                # a rank's own error lines are in its log already: counted, not repeated in the agent's log
                if event.level >= FaultLevel.DEGRADED and event.kind != "rank_log":
                    log.warning("%s %s on %s: %s", event.level.label, event.kind, event.entity, event.message[:200])
            if self._pusher is not None:
                self.pending_events.extend(e for e in events if id(e) not in dropped)
                self._bound_pending()

    def _bound_pending(self) -> None:
        """Drop the oldest pending events beyond the bound: a server down for hours must not grow the agent
        past its memory budget. Called with the lock held."""
        excess = max(0, len(self.pending_events) - MAX_PENDING_EVENTS)
        if not excess:
            return
        self.events_dropped += excess
        self._spool_forget(self.pending_events[:excess])
        del self.pending_events[:excess]

    def push(self, mono: float) -> None:
        if self._pusher is None or mono < self._next_push or self._pusher.busy:
            return
        self._next_push = mono + self.settings.push_interval_s
        self.take_over()
        with self._lock:
            batch, self.pending_events = self.pending_events, []
        inventory: Node | None = self.inventory()
        if inventory == self._pusher.registered:
            inventory = None
        now = self.clock()
        samples = [Sample(ts=now, entity=p.entity, metric=p.metric, value=p.value) for p in self.points()
                   if math.isfinite(p.value)] if self.settings.push_samples else []
        self._pusher.send(batch, requeue=self._requeue, samples=samples, node=self.node, inventory=inventory,
                          settled=self._settled)

    def inventory(self) -> Node:
        """This node as the server's topology should hold it: GPUs (index, UUID, PCI bus, model) and NICs."""
        gpus: dict[int, Gpu] = {}
        for runner in self.runners:
            for index, gpu in getattr(runner.source, "gpus", {}).items():
                # NVML and dcgm-exporter both describe a GPU; each fills what the other left empty.
                known = gpus.get(index)
                gpus[index] = gpu if known is None else known.model_copy(
                    update={k: v for k, v in gpu.model_dump().items() if v and not getattr(known, k)})
        nics = sorted({parse_entity(p.entity)[1][1]: p.value for p in self.points()
                       if p.metric == "vigil_nic_speed_gbps" and math.isfinite(p.value)}.items())
        return Node(name=self.node, gpus=[gpus[i] for i in sorted(gpus)],
                    nics=[Nic(node=self.node, name=name, speed_gbps=rate) for name, rate in nics],
                    labels=dict(self.settings.labels))

    def _requeue(self, events: list[Event]) -> None:
        with self._lock:
            # the ones the full spool dropped while they were sent stay dropped (counted then)
            self.pending_events[:0] = [e for e in events if self._evicted.pop(id(e), None) is None]
            self._bound_pending()

    def record(self, mono: float) -> None:
        """Append the latest values to the embedded history once every source has answered or timed out."""
        if self.store is None or mono < self._next_record:
            return
        if any(r.reads == 0 and r.timeouts == 0 for r in self.runners):
            return
        self._next_record = mono + self.settings.record_interval_s
        self.store.record(self.clock(), self.points())
        self.store.maintain(self.clock(), mono)

    def step(self) -> float:
        """One turn of the loop; returns how long to sleep before the next."""
        mono = time.monotonic()
        self.check_load(mono)
        self.schedule(mono)
        self.harvest()
        self.push(mono)
        self.record(mono)
        wake = [r.next_due for r in self.runners if not r.busy] + [self._next_load_check]
        if self.store is not None:
            wake.append(self._next_record)
        wake += [r.started + r.timeout_s for r in self.runners if r.busy and not r.timed_out]
        # Finished reads are harvested at the next wake-up, at most half a second later.
        return max(0.05, min(0.5, min(wake) - time.monotonic()))

    def run(self, duration_s: float | None = None) -> None:
        """The agent loop, until ``stop_event`` is set or ``duration_s`` has passed."""
        end = None if duration_s is None else time.monotonic() + duration_s
        while not self.stop_event.is_set():
            pause = self.step()
            if end is not None and time.monotonic() >= end:
                break
            self.stop_event.wait(pause)

    def close(self) -> None:
        self.stop_event.set()
        for runner in self.runners:
            if not runner.busy:
                runner.source.close()
        if self.store is not None:
            self.store.close()
        if self.spool is not None:
            # a push in flight leaves its events in the spool: sent again at the next start, stored once
            with self._lock:
                self.spool.close()
                self.spool = None

    # ---------------------------------------------------------------- views

    def points(self) -> list[Point]:
        return [p for r in self.runners for p in r.points]

    def events_snapshot(self) -> dict[tuple[str, str], int]:
        """Events seen per (kind, level); a copy, since the exposition thread reads while the loop counts."""
        with self._lock:
            return dict(self.events_total)

    @property
    def events_refused(self) -> int:
        """Rank-log lines the server refused (and the agent dropped); the events route's in events_batch_refused."""
        return self._pusher.refused if self._pusher is not None else 0

    @property
    def events_batch_refused(self) -> int:
        """Events of the events route's batches the server refused for good (listed in a 422, or refused alone)."""
        return self._pusher.batch_refused if self._pusher is not None else 0

    @property
    def events_refused_by_reason(self) -> dict[str, int]:
        """The refused rank-log events by the server's reason (RANK_LOG_REFUSALS); a copy."""
        return dict(self._pusher.refused_by_reason) if self._pusher is not None else {}

    def report(self) -> dict[str, Any]:
        """What `vigil agent --once --json` prints."""
        return {
            "node": self.node,
            "degraded": self.degraded,
            "cpu_ratio": round(self.cpu_last, 3),
            "sources": [
                {
                    "name": r.name,
                    "kind": r.source.kind,
                    "up": r.up,
                    "status": r.status,
                    "interval_s": self.effective_interval(r),
                    "points": len(r.points),
                    "reads": r.reads,
                    "timeouts": r.timeouts,
                    "failures": r.failures,
                    "problems": r.source.problems.snapshot(),
                    "duration_ms": round(r.last_duration_s * 1000, 1),
                }
                for r in self.runners
            ],
            "points": [
                {"metric": p.metric, "entity": p.entity, "value": p.value, "labels": dict(p.labels)}
                for p in self.points()
            ],
            "events": {f"{kind}/{level}": n for (kind, level), n in sorted(self.events_snapshot().items())},
            "events_dropped": self.events_dropped,
            "events_spooled": len(self.spool) if self.spool is not None else None,
            "events_refused": self.events_refused,
            "events_batch_refused": self.events_batch_refused,
            "events_refused_by_reason": self.events_refused_by_reason,
            "samples_backlog": self._pusher.backlog_report() if self._pusher is not None else None,
            "labels": {"refused": self.guard.refused_count, "folded": self.guard.folded_count},
        }

    def serve(self, port: int | None = None) -> tuple[Any, int]:
        """Start the Prometheus endpoint; returns (server, port)."""
        registry = CollectorRegistry()
        registry.register(AgentExposition(self))
        ProcessCollector(registry=registry, namespace="vigil_agent")
        server, _thread = start_http_server(self.settings.port if port is None else port, registry=registry)
        return server, server.server_port


# --------------------------------------------------------------------------- assembling a node's sources


def build_sources(settings: AgentSettings) -> list[Source]:
    """Every source this node can have; each one says in its status when its device or service is absent."""
    node = settings.node or default_node_name()
    gpus = NvmlCollector(node=node)
    nics = InfinibandCollector(node=node)
    sources: list[Source] = [HostCollector(node=node), gpus, nics]
    exporter_gpus: dict[str, int] = {}
    if settings.dcgm_url:
        dcgm = DcgmExporterScraper(settings.dcgm_url, node=node, timeout_s=settings.timeout_s)
        exporter_gpus = dcgm.pci_to_index
        sources.append(dcgm)

    def gpu_index(pci_bus: str) -> int | None:
        index = gpus.pci_to_index.get(pci_bus)
        return exporter_gpus.get(pci_bus) if index is None else index

    kernel_options: dict[str, Any] = {"node": node, "gpu_index": gpu_index, "nic_name": nics.device_of_pci}
    if settings.server_url and settings.state_dir:
        # the same time for the same record after a restart: the server stores a record read again once
        kernel_options["boot_time"] = stable_boot_time(Path(settings.state_dir))
    if settings.kmsg_file:
        kernel: Source | None = KernelLogSource.from_file(Path(settings.kmsg_file), **kernel_options)
    else:
        kernel = KernelLogSource.auto(**kernel_options)
    if kernel is None:
        log.warning(
            "no kernel log: /dev/kmsg is not readable and the journal holds no kernel messages; "
            "Xids come from dcgm-exporter's last-Xid gauge only, if it runs"
        )
        for source in sources:
            if isinstance(source, DcgmExporterScraper):
                source.xid_events = True
    else:
        sources.append(kernel)
    if in_cluster():
        sources.append(KubernetesSource(node=node))
    if settings.rank_logs:
        sources.append(RankLogSource(settings.rank_logs, node=node))
    return sources


# --------------------------------------------------------------------------- exposition and push


def entity_labels(entity: str) -> dict[str, str]:
    """Prometheus labels of an entity id: gpu/n01/3 -> {node: n01, gpu: 3}."""
    kind, parts = parse_entity(entity)
    if kind == "gpu":
        return {"node": parts[0], "gpu": parts[1]}
    if kind == "nic":
        return {"node": parts[0], "nic": parts[1]}
    if kind == "node":
        return {"node": parts[0]}
    raise VigilInputError(f"the node agent exposes node, gpu and nic entities, not {entity!r}")


class AgentExposition(Collector):
    """The agent's latest points as Prometheus gauges (series folded by the label guard are summed)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        series: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(lambda: defaultdict(float))
        for point in self.agent.points():
            # The entity's own node / gpu / nic labels win over a source's labels of the same name.
            labels = tuple(sorted({**dict(point.labels), **entity_labels(point.entity)}.items()))
            series[point.metric][labels] += point.value
        for metric, values in sorted(series.items()):
            names = sorted({name for labels in values for name, _ in labels})
            family = GaugeMetricFamily(metric, f"{metric} as read by the Vigil node agent", labels=names)
            for labels, value in values.items():
                as_dict = dict(labels)
                family.add_metric([as_dict.get(n, "") for n in names], value)
            yield family
        yield from self._self_metrics()

    def _self_metrics(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        agent = self.agent
        up = GaugeMetricFamily("vigil_agent_source_up", "1 when the source's last read answered", labels=["source"])
        timeouts = CounterMetricFamily("vigil_agent_source_timeouts", "reads past their timeout", labels=["source"])
        problems = CounterMetricFamily(
            "vigil_agent_source_problems",
            "bad input and failures counted per kind",
            labels=["source", "problem"],
        )
        duration = GaugeMetricFamily("vigil_agent_source_duration_seconds", "last read's duration", labels=["source"])
        for runner in agent.runners:
            up.add_metric([runner.name], int(runner.up))
            timeouts.add_metric([runner.name], runner.timeouts)
            duration.add_metric([runner.name], runner.last_duration_s)
            for problem, count in runner.source.problems.snapshot().items():
                problems.add_metric([runner.name, problem], count)
        events = CounterMetricFamily("vigil_agent_events", "events seen by kind and level", labels=["kind", "level"])
        for (kind, level), count in sorted(agent.events_snapshot().items()):
            events.add_metric([kind, level], count)
        dropped = CounterMetricFamily("vigil_agent_events_dropped", "events dropped: the queue for the server was "
                                      "full (queue_full), the server refused rank-log lines (refused) or events of "
                                      "an events batch (batch_refused)", labels=["reason"])
        dropped.add_metric(["queue_full"], agent.events_dropped)
        dropped.add_metric([SPOOL_FULL], agent.events_spool_dropped)
        dropped.add_metric(["refused"], agent.events_refused)
        dropped.add_metric(["batch_refused"], agent.events_batch_refused)
        refused = CounterMetricFamily("vigil_agent_rank_log_events_refused", "rank-log events the server refused "
                                      "(and the agent dropped), by the server's reason", labels=["reason"])
        for reason, count in sorted(agent.events_refused_by_reason.items()):
            refused.add_metric([reason], count)
        yield from (up, timeouts, problems, duration, events, dropped, refused)
        if agent.spool is not None:
            yield GaugeMetricFamily("vigil_agent_events_spooled", "events on disk the server has not answered for",
                                    value=len(agent.spool))
            yield GaugeMetricFamily("vigil_agent_events_spool_bytes", "bytes of the events on disk the server has "
                                    "not answered for", value=agent.spool.bytes)
            yield CounterMetricFamily("vigil_agent_events_spool_failures", "writes to the events spool that failed "
                                      "(a full disk): new events kept in memory only, or answered ones removed later",
                                      value=agent.spool_failures)
        if agent._pusher is not None:
            yield from agent._pusher.backlog_metrics()
        yield GaugeMetricFamily(
            "vigil_agent_degraded", "1 while the agent samples under node CPU load", value=int(agent.degraded)
        )
        labels = CounterMetricFamily(
            "vigil_agent_labels", "labels refused or folded by the hygiene guard", labels=["outcome"]
        )
        labels.add_metric(["refused"], agent.guard.refused_count)
        labels.add_metric(["folded"], agent.guard.folded_count)
        yield labels


class SamplesPush(NamedTuple):
    """An agent's samples push: the key it is sent under (``Idempotency-Key``, the same when sent again), its body
    as sent (JSON; held as bytes, so the backlog's size is what it costs) and when it was made (monotonic)."""

    key: str
    body: bytes
    made: float


class EventPusher:
    """POSTs to the Vigil server in a background thread: the node's inventory when it changed, event batches
    (re-queued when they fail) and the latest samples. Each samples push carries a key of its own
    (``Idempotency-Key``) and joins a backlog; every round sends its own push first (the server's live view has the
    node's newest values at once; its engine does not let the older pushes that follow roll them back), then at most
    ``backlog_per_round`` of the backlog oldest first, each push under its own key, until one gets no answer (the
    server unreachable, failing, or its answer lost after it stored the push), which stays where it is with all
    behind it for the next round - the server stores a push sent again once. The
    backlog is bounded by count, bytes and age (``samples_backlog_*``); beyond, the oldest push is dropped and
    counted, with one warning for each stretch of drops (an episode ends when the server has taken the whole
    backlog). A push the server refuses (HTTP 4xx but 408, 425 and 429, which are sent again, and 401 and 403) is
    dropped alone and the next one sent. Each push is written to the spool's samples queue (``attach_spool``, the
    events' spool file) before it is first sent and removed from it when it leaves the backlog, so that an agent
    restarted - during an outage, or killed with a push in flight - sends what its backlog held, oldest first, each
    under its key (a push the server stored but whose answer was lost is stored once), with its age counted from when
    it was made (wall clock). That costs two fsynced transactions a push while the server takes every push
    (``bench/push_spool.py``).

    Each route's answer stands for that route alone: an events batch the server fails (5xx, 408 / 425 / 429, its
    answer lost) is kept for the next round and one it refuses for good (``refused_for_good``: a 422 after the
    schema drifted in a rolling upgrade) is dropped and counted, and either way the round goes on to the rank-log
    and samples pushes. An inventory the server refuses for good is sent again each round (an upgraded server
    takes it) and the round goes on; one it fails stops the round, since the server places what follows on it.
    The round stops, everything kept, where the server cannot be reached at all (no connection). A 401 or 403
    refuses the token, not the data: events and samples are kept (the bounded queue and backlog drop the oldest)
    and the agent warns once until the server takes a push again.

    Rank-log events go to the rank-log route with the node's name, which the server checks them against, one
    push per job. The server stores the valid events of a push and answers which it refused and why (a layout
    naming ranks placed on another node); the refused ones are dropped and counted by reason, since sending them
    again cannot help, as are all of a push it refuses whole (``refused_for_good``: HTTP 400, 404, 413, 422...)."""

    def __init__(self, server_url: str, token: str = "", timeout_s: float = 5.0, backlog_pushes: int = 24,
                 backlog_bytes: int = 4 * 2**20, backlog_age_s: float = SERVER_LIVE_PUSH_MAX_AGE_S,
                 backlog_per_round: int = 20,
                 clock: Callable[[], float] = time.monotonic, events_batch_bytes: int = 512 * 1024,
                 events_batch_max: int = 1000, wall: Callable[[], float] = time.time) -> None:
        self.base = server_url.rstrip("/") + "/api/v1"
        self.url = self.base + "/events"
        self.registered: Node | None = None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers)
        self.timeout_s = timeout_s
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.failures = 0
        self.refused = 0  # rank-log lines refused
        self.batch_refused = 0  # events of events batches refused: listed in a 422, or refused when sent alone
        self.events_batch_limits = (events_batch_bytes, events_batch_max)
        self._misrouted = False  # in an episode of 404 / 421 answers: warned once, until a push is taken
        self.refused_by_reason: dict[str, int] = defaultdict(int)
        self._warned = False
        self._warned_refused: set[str] = set()
        self._refusing_events = False  # in an episode of refused events batches: warned once, until one is taken
        self._crashed = False  # in an episode of push rounds failing unexpectedly: logged once, until one ends well
        self._refusing_inventory = False
        self._token_refused = False  # in an episode of a refused token: warned once, until a push is taken
        # the samples pushes the server has not answered, oldest first, each sent again under its key
        self.backlog: deque[SamplesPush] = deque()
        self.backlog_bytes = 0
        self.backlog_limits = (backlog_pushes, backlog_bytes, backlog_age_s)
        self.backlog_per_round = backlog_per_round
        self._clock = clock
        self.samples_pushes_sent = 0
        self.samples_pushes_dropped: dict[str, int] = dict.fromkeys(SAMPLES_DROP_REASONS, 0)
        self._dropping = False  # in a drop episode: warned once, until the backlog is taken whole
        # the backlog on disk (the spool's samples queue): the row of each push written there, by its key
        self._wall = wall
        self.spool: SpoolQueue | None = None
        self._spooled: dict[str, int] = {}
        self._unremoved: list[int] = []  # rows of pushes gone from the backlog whose removal failed: removed next time
        self.spool_failures = 0
        self._spool_failing = False  # in an episode of failed writes: warned once, until one succeeds

    @property
    def samples_pushes_refused(self) -> int:
        return self.samples_pushes_dropped[REFUSED]

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def send(
        self,
        events: list[Event],
        requeue: Callable[[list[Event]], None],
        samples: list[Sample] | None = None,
        node: str = "",
        inventory: Node | None = None,
        settled: Callable[[list[Event]], None] | None = None,
    ) -> None:
        self._thread = threading.Thread(
            target=self._post, args=(events, requeue, samples or [], node, inventory, settled), daemon=True,
            name="vigil-agent-push",
        )
        self._thread.start()

    def _post(self, events: list[Event], requeue: Callable[[list[Event]], None], samples: list[Sample], node: str,
              inventory: Node | None, settled: Callable[[list[Event]], None] | None = None) -> None:
        """One push round (the push thread). Whatever goes wrong in it, each of ``events`` is either settled
        (answered for) or queued again: a round that fails unexpectedly (an answer of a shape no rule foresaw)
        queues them all again - the server stores again an event it took once - and is logged, once an episode."""
        try:
            kept = self._round(events, samples, node, inventory)
        except Exception:
            self.failures += 1
            if not self._crashed:
                self._crashed = True
                log.exception("push round to %s failed unexpectedly; its %d event(s) are kept and sent again",
                              self.base, len(events))
            kept = list(events)
        else:
            self._crashed = False
        if settled is not None:
            unsettled = {id(e) for e in kept}
            settled([e for e in events if id(e) not in unsettled])  # answered for: off the spool
        if kept:
            requeue(kept)
        self._persist()

    def attach_spool(self, spool: SpoolQueue) -> None:
        """Keep the backlog on disk in ``spool`` too, and take what it holds (an agent stopped or killed while the
        server was away) into the backlog first, oldest first; pushes past the backlog's limits - its age from when
        each was made - are dropped and counted as ever. Before the first round."""
        rows = spool.rows()
        spool.keep(rows)
        self.spool = spool
        self._take_in(rows, on_disk=True)
        if rows:
            log.warning("sending the %d samples push(es) the spool %s held from before this start (%d dropped as "
                        "past the backlog's limits)", len(self.backlog), spool.spool.path,
                        len(rows) - len(self.backlog))

    def adopt(self, rows: list[tuple[Any, ...]]) -> None:
        """Take into the backlog the samples pushes of a spool file another agent left ((id, body, key, made) rows):
        in the order made among the backlog's, within its limits, and written to this agent's spool."""
        self._take_in(rows, on_disk=False)
        self._persist()

    def _take_in(self, rows: list[tuple[Any, ...]], on_disk: bool) -> None:
        """Put spooled pushes ((id, body, key, made by the wall clock) rows) into the backlog, in the order made, and
        drop the oldest past its limits (counted as ever). ``on_disk``: the rows are this agent's spool's."""
        now, wall = self._clock(), self._wall()
        known = {p.key for p in self.backlog}
        pushes = []
        for row_id, body, key, made in rows:
            if str(key) in known:
                continue
            push = SamplesPush(str(key), str(body).encode(), now - max(0.0, wall - float(made)))
            if on_disk:
                self._spooled[push.key] = row_id
            pushes.append(push)
            self.backlog_bytes += len(push.body)
        self.backlog = deque(sorted([*self.backlog, *pushes], key=lambda p: p.made))
        most, most_bytes, _ = self.backlog_limits
        while len(self.backlog) > most or (self.backlog_bytes > most_bytes and len(self.backlog) > 1):
            self._drop(BACKLOG_FULL)
        self._drop_expired()

    def _persist(self) -> None:
        """Write the backlog's pushes not on disk yet to the spool (one transaction): the round's own, before it is
        sent, and ones taken over from another agent's file. A failing write (a full disk) keeps them in memory,
        warned once an episode, and the push is sent all the same."""
        if self.spool is None:
            return
        new = [p for p in self.backlog if p.key not in self._spooled]
        if not new and not self._unremoved:
            return
        now, wall = self._clock(), self._wall()
        try:
            if self._unremoved:
                self.spool.remove(self._unremoved)
                self._unremoved = []
            ids, evicted = self.spool.add([(p.body.decode(), p.key, wall - (now - p.made)) for p in new])
        except (OSError, sqlite3.Error) as err:
            self.spool_failures += 1
            if not self._spool_failing:
                self._spool_failing = True
                log.warning("the samples spool %s failed (%s): the samples backlog is kept in memory only until it "
                            "takes a write again", self.spool.spool.path, err)
            return
        self._spool_failing = False
        for push, row_id in zip(new, ids, strict=True):
            self._spooled[push.key] = row_id
        gone = set(evicted)  # past the disk's bounds, the backlog's own: its oldest, dropped from memory too
        for push in [p for p in self.backlog if self._spooled.get(p.key) in gone]:
            del self._spooled[push.key]
            self._drop(BACKLOG_FULL, push)

    def _unspool(self, push: SamplesPush) -> None:
        """A push left the backlog (taken, refused, dropped): off the disk too."""
        row_id = self._spooled.pop(push.key, None)
        if row_id is None or self.spool is None:
            return
        try:
            self.spool.remove([row_id, *self._unremoved])
            self._unremoved = []
        except (OSError, sqlite3.Error):  # removed with the next; sent again after a restart, stored once
            self.spool_failures += 1
            self._unremoved.append(row_id)

    def _round(self, events: list[Event], samples: list[Sample], node: str, inventory: Node | None) -> list[Event]:
        """Send a round's inventory, events, rank-log lines and samples; returns the events to queue again."""
        fresh = None
        if samples:
            push = {"node": node, "samples": [s.model_dump(mode="json") for s in samples]}
            fresh = SamplesPush(uuid.uuid4().hex, json.dumps(push, separators=(",", ":")).encode(), self._clock())
            self._keep(fresh)
            self._persist()  # on disk before it is sent: an agent killed mid-push sends it again, stored once
        # one push per job: a push the server refuses whole costs only its own job's lines
        rank_logs = sorted((e for e in events if e.kind == "rank_log"), key=lambda e: e.entity.split("/")[1])
        others = [e for e in events if e.kind != "rank_log"]
        kept: list[Event] = []  # what goes back to the queue for the next round
        stop = False  # no use sending more this round: the server cannot be reached, or its inventory failed
        if inventory is not None:
            # The inventory first: the server places the events and samples that follow on it.
            try:
                self._post_inventory(inventory)
            except httpx.HTTPError as err:
                self._failed(err)
                stop = True
        if others and not stop:
            unsent, failure = self._post_events(others)
            if failure is not None:
                stop = self._failed(failure)
                kept += unsent  # the server failed them or did not answer: sent again next round
        elif others:
            kept += others
        for _job, lines in itertools.groupby(rank_logs, key=lambda e: e.entity.split("/")[1]):
            batch = list(lines)
            if stop:
                kept += batch
                continue
            unsent, failure = self._post_events(
                batch, lambda part, docs: self._post_rank_logs(node, part, docs))  # noqa: B023 - called at once
            if failure is not None:
                stop = self._failed(failure)
                kept += unsent
        if not stop:
            try:
                self._send_backlog(fresh)
            except httpx.HTTPError as err:
                self._failed(err)
        return kept

    def _failed(self, err: httpx.HTTPError) -> bool:
        """Count a request the server failed or did not answer, and warn: about a refused token once an episode,
        about the rest once. True when the server could not be reached at all (the round stops there: every other
        request would wait for the same connection)."""
        self.failures += 1
        response = err.response if isinstance(err, httpx.HTTPStatusError) else None
        if response is not None and response.status_code in MISROUTED_STATUSES:
            if not self._misrouted:
                self._misrouted = True
                log.warning("server %s answered HTTP %d on %s (%s): the request went to the wrong place (an ingress "
                            "mid-rollout, a wrong path prefix in VIGIL_AGENT_SERVER_URL?); events and samples are "
                            "kept (the oldest dropped beyond the queue's and backlog's limits) and sent again",
                            self.base, response.status_code, response.request.url.path, _detail(response))
        elif response is not None and response.status_code in TOKEN_REFUSED_STATUSES:
            if not self._token_refused:
                self._token_refused = True
                log.warning("server %s refused this agent's token (HTTP %d: %s); check VIGIL_AGENT_SERVER_TOKEN - "
                            "events and samples are kept (the oldest dropped beyond the queue's and backlog's "
                            "limits) and sent once it is taken", self.base, response.status_code, _detail(response))
        elif not self._warned:
            self._warned = True
            log.warning("push to %s failed (%s); events and samples are kept and retried", self.base, err)
        return isinstance(err, (httpx.ConnectError, httpx.ConnectTimeout))

    def _taken(self) -> None:
        """The server took a push: a refused token's and a misrouting episode are over."""
        self._token_refused = False
        self._misrouted = False

    def _post_inventory(self, inventory: Node) -> None:
        response = self._client.post(self.base + "/inventory", json=inventory.model_dump(mode="json"))
        if refused_for_good(response.status_code):
            # sent again next round, not marked registered: a server upgraded meanwhile takes it
            if not self._refusing_inventory:
                self._refusing_inventory = True
                log.warning("server %s refused this node's inventory (HTTP %d: %s); events and samples are sent "
                            "without it and it is sent again each round", self.base, response.status_code,
                            _detail(response))
            return
        response.raise_for_status()
        self._refusing_inventory = False
        self._taken()
        self.registered = inventory

    def _post_events(self, events: list[Event], send: Callable[[list[Event], list[dict[str, Any]]], tuple[
            list[Event], httpx.HTTPError | None]] | None = None) -> tuple[list[Event], httpx.HTTPError | None]:
        """Send the queued events in POSTs of at most ``events_batch_limits`` (bytes, events), in order, each with
        ``send`` (default: to the events route; a job's rank-log lines go to theirs). Returns the events not sent
        (the one failing or unanswered and all behind it, for the next round) and the error that stopped them, or
        ([], None) once every event was taken or refused."""
        send = send or self._post_events_batch
        docs = [e.model_dump(mode="json") for e in events]
        most_bytes, most = self.events_batch_limits
        start = size = 0
        for i, doc in enumerate(docs):
            # json.dumps' defaults (spaces, \u escapes) write at least as many bytes as the client sends
            cost = len(json.dumps(doc)) + 2
            if i > start and (i - start >= most or size + cost > most_bytes):
                unsent, err = send(events[start:i], docs[start:i])
                if err is not None:
                    return unsent + events[i:], err
                start, size = i, 0
            size += cost
        return send(events[start:], docs[start:]) if start < len(events) else ([], None)

    def _post_events_batch(self, events: list[Event], docs: list[dict[str, Any]],
                           ) -> tuple[list[Event], httpx.HTTPError | None]:
        """Send one events batch. Refused for good, it is never dropped whole: a 422 naming its bad events (the
        server's ``errors[].loc``, ``["body", index, ...]``) drops those and sends the rest again, any other refusal
        (413 from a proxy's body limit, a 422 naming none) splits it in half and sends each half, down to one event;
        an event refused when sent alone is dropped and counted (``vigil_agent_events_dropped_total``
        ``{reason="batch_refused"}``), warned about once an episode. A 422 of a server that names every refused
        event (``invalid_indices``) costs one POST more at most, however many are refused. Returns the error that
        stopped it (the server failing or not answering) with the batch's events neither taken nor refused, in
        order; ([], None) when none is left."""
        work: list[tuple[list[Event], list[dict[str, Any]]]] = [(events, docs)]
        while work:
            batch, body = work.pop()
            try:
                response = self._client.post(self.url, json=body)
                if not refused_for_good(response.status_code):
                    response.raise_for_status()
            except httpx.HTTPError as err:
                return batch + [e for part, _ in reversed(work) for e in part], err
            if not refused_for_good(response.status_code):
                self._refusing_events = False
                self._taken()
                self.sent += len(batch)
                continue
            bad = _invalid_indices(response, len(batch)) if response.status_code == 422 else set()
            if bad:
                self._refuse_events(len(bad), response)
                rest = [i for i in range(len(batch)) if i not in bad]
                if rest:
                    work.append(([batch[i] for i in rest], [body[i] for i in rest]))
            elif len(batch) == 1:
                self._refuse_events(1, response)
            else:
                half = len(batch) // 2
                work.append((batch[half:], body[half:]))
                work.append((batch[:half], body[:half]))
        return [], None

    def _refuse_events(self, count: int, response: httpx.Response) -> None:
        """Count events the events route refused for good (sending them again cannot help); warn once an episode."""
        self.batch_refused += count
        if not self._refusing_events:
            self._refusing_events = True
            log.warning("server %s refused %d event(s) (HTTP %d: %s); they are dropped, as is every event refused "
                        "until the server takes a batch again (counted in vigil_agent_events_dropped_total"
                        "{reason=\"batch_refused\"}, not logged); the other events of their batch are sent again",
                        self.url, count, response.status_code, _detail(response))

    def _keep(self, push: SamplesPush) -> None:
        """Put a new push at the backlog's tail and drop the oldest beyond the limits (the newest always stays)."""
        self.backlog.append(push)
        self.backlog_bytes += len(push.body)
        most, most_bytes, _ = self.backlog_limits
        while len(self.backlog) > most or (self.backlog_bytes > most_bytes and len(self.backlog) > 1):
            self._drop(BACKLOG_FULL)
        self._drop_expired()

    def _drop_expired(self) -> None:
        oldest = self._clock() - self.backlog_limits[2]
        while self.backlog and self.backlog[0].made < oldest:
            self._drop(EXPIRED)

    def _drop(self, reason: str, push: SamplesPush | None = None) -> None:
        """Drop ``push`` (default: the oldest) from the backlog, counted by ``reason``; a refusal warns once in the
        agent's life, the backlog's limits once an episode."""
        if push is None or push is self.backlog[0]:
            push = self.backlog.popleft()
        else:
            self.backlog.remove(push)
        self.backlog_bytes -= len(push.body)
        self._unspool(push)
        self.samples_pushes_dropped[reason] += 1
        if reason == REFUSED or self._dropping:
            return
        self._dropping = True
        most, most_bytes, age_s = self.backlog_limits
        log.warning("the server %s has not taken this node's samples pushes for a while: the oldest unanswered "
                    "ones are dropped from now until it takes the backlog (limits %d pushes, %d bytes, %g s; "
                    "counted in vigil_agent_samples_pushes_dropped_total, not logged)", self.base, most, most_bytes,
                    age_s)

    def _send_backlog(self, fresh: SamplesPush | None) -> None:
        """Send the round's own push (``fresh``) first, so that the server's live view has the node's newest values
        at once, then the backlog oldest first, at most ``backlog_per_round`` pushes; a push with no answer raises
        and stays, with every push behind it. A push found older than the age limit (the round may run long) is
        dropped, not sent."""
        self._drop_expired()
        if fresh is not None and self.backlog and self.backlog[-1] is fresh:
            self._send_one(fresh)
        sent = 0
        while self.backlog and (self.backlog_per_round == 0 or sent < self.backlog_per_round):
            push = self.backlog[0]
            if push.made < self._clock() - self.backlog_limits[2]:
                self._drop(EXPIRED)
                continue
            self._send_one(push)
            sent += 1
        if not self.backlog:
            self._dropping = False

    def _send_one(self, push: SamplesPush) -> None:
        """Send one push of the backlog under its key: taken or refused, it leaves the backlog; no answer raises."""
        response = self._client.post(self.base + "/samples", content=push.body,
                                     headers={IDEMPOTENCY_KEY_HEADER: push.key, "Content-Type": "application/json"})
        if refused_for_good(response.status_code):
            self._refuse_samples(push, response)  # sending it again cannot help; the next push may still go
            return
        response.raise_for_status()
        self._taken()
        self._drop_sent(push)

    def _drop_sent(self, push: SamplesPush) -> None:
        if push is self.backlog[0]:
            self.backlog.popleft()
        else:
            self.backlog.remove(push)
        self.backlog_bytes -= len(push.body)
        self._unspool(push)
        self.samples_pushes_sent += 1

    def _refuse_samples(self, push: SamplesPush, response: httpx.Response) -> None:
        """Drop a samples push the server refused; warn about the first."""
        self._drop(REFUSED, push)
        if self.samples_pushes_refused == 1:
            log.warning("server %s refused a samples push (HTTP %d: %s); it is dropped (further refusals are "
                        "counted, not logged)", self.base, response.status_code, _detail(response))

    def backlog_report(self) -> dict[str, Any]:
        """The samples backlog for ``vigil agent --once --json``."""
        return {"pushes": len(self.backlog), "bytes": self.backlog_bytes, "sent": self.samples_pushes_sent,
                "dropped": dict(self.samples_pushes_dropped), "spooled": len(self._spooled)}

    def backlog_metrics(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily("vigil_agent_samples_backlog_pushes", "samples pushes the server has not taken yet",
                                value=len(self.backlog))
        yield GaugeMetricFamily("vigil_agent_samples_backlog_bytes", "bytes of the samples pushes the server has not "
                                "taken yet", value=self.backlog_bytes)
        yield CounterMetricFamily("vigil_agent_samples_pushes_sent", "samples pushes the server took",
                                  value=self.samples_pushes_sent)
        if self.spool is not None:
            yield GaugeMetricFamily("vigil_agent_samples_spooled", "samples pushes of the backlog on disk",
                                    value=len(self._spooled))
            yield CounterMetricFamily("vigil_agent_samples_spool_failures", "writes and removals of the samples "
                                      "spool that failed (a full disk)", value=self.spool_failures)
        dropped = CounterMetricFamily("vigil_agent_samples_pushes_dropped", "samples pushes dropped unsent: pushed out "
                                      "of the full backlog, older than its age limit, or refused by the server",
                                      labels=["reason"])
        for reason, count in self.samples_pushes_dropped.items():
            dropped.add_metric([reason], count)
        yield dropped

    def _post_rank_logs(self, node: str, events: list[Event], docs: list[dict[str, Any]],
                        ) -> tuple[list[Event], httpx.HTTPError | None]:
        """Send one rank-log push of a job's lines. One a proxy refuses as too large (413) is split in half and each
        half sent, down to one line; one refused for good otherwise (or a line too large alone) is dropped and
        counted as push_refused. Returns the lines neither taken nor refused, with the error that stopped them."""
        work: list[tuple[list[Event], list[dict[str, Any]]]] = [(events, docs)]
        while work:
            batch, body = work.pop()
            try:
                response = self._client.post(self.base + "/rank-logs", json={"node": node, "events": body})
                if not refused_for_good(response.status_code):
                    response.raise_for_status()
            except httpx.HTTPError as err:
                return batch + [e for part, _ in reversed(work) for e in part], err
            if response.status_code == TOO_LARGE and len(batch) > 1:
                half = len(batch) // 2
                work.append((batch[half:], body[half:]))
                work.append((batch[:half], body[:half]))
                continue
            if refused_for_good(response.status_code):
                self._refuse(node, {PUSH_REFUSED: len(batch)}, f"HTTP {response.status_code}: {_detail(response)}")
                continue
            self._taken()
            counts, detail = _refusals(response, len(batch))
            self.sent += len(batch) - sum(counts.values())
            if counts:
                self._refuse(node, counts, detail)
        return [], None

    def _refuse(self, node: str, counts: dict[str, int], detail: str) -> None:
        """Count refused rank-log events by reason; warn once a reason."""
        for reason, count in counts.items():
            self.refused += count
            self.refused_by_reason[reason] += count
            if reason not in self._warned_refused:
                self._warned_refused.add(reason)
                log.warning("server %s refused %d rank-log event(s) of node %s (%s: %s); check the rank_logs "
                            "layouts (further refusals are counted, not logged)", self.base, count, node, reason,
                            detail)


def _detail(response: httpx.Response) -> str:
    """The server's word on a refusal, for a log line: its answer's text, cut short."""
    return response.text[:300]


def _refusals(response: httpx.Response, pushed: int) -> tuple[dict[str, int], str]:
    """The refused events a rank-log route's answer counts by reason (at most ``pushed`` in all; a reason this
    agent does not know is "other"), and the first refusal's detail. An answer without them (a server that
    answers only ``stored``) refused nothing."""
    try:
        answer = response.json()
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return {}, ""
    by_reason = answer.get("rejected_by_reason") if isinstance(answer, dict) else None
    if not isinstance(by_reason, dict):
        return {}, ""
    counts: dict[str, int] = defaultdict(int)
    left = pushed
    for reason, count in by_reason.items():
        if isinstance(count, int) and count > 0 and left > 0:
            counts[reason if reason in RANK_LOG_REFUSALS else "other"] += min(count, left)
            left -= min(count, left)
    listed = answer.get("rejections")
    first = listed[0] if isinstance(listed, list) and listed and isinstance(listed[0], dict) else {}
    return dict(counts), str(first.get("detail", ""))[:300]


def _invalid_indices(response: httpx.Response, pushed: int) -> set[int]:
    """The indices of the events a 422 names as invalid: the server's ``invalid_indices`` (every refused event of
    the batch, however many), else each error's ``loc``, ``["body", index, field...]`` (the ``errors`` of a server
    before ``invalid_indices``, which lists at most 20 - the rest is named by the next POST's answer - or FastAPI's
    own ``detail`` list on a server without Vigil's handler); empty when it names none (a body too long, an answer
    of another shape).

    ``invalid_indices`` is taken only where it agrees with the errors described beside it: each an index of the
    batch (an integer in range, once), naming every event an error names, and - where fewer errors are described
    than a list holds at most (``SERVER_MAX_LISTED_ERRORS``), so all are - no other. A list that does not (a server
    or proxy answering for another batch, an index off by one) could name good events, which would be dropped:
    the errors alone are read then, each an error the server found."""
    try:
        answer = response.json()
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return set()
    if not isinstance(answer, dict):
        return set()
    errors = answer.get("errors") if isinstance(answer.get("errors"), list) else answer.get("detail")
    described = errors if isinstance(errors, list) else []
    found: set[int] = set()
    for error in described:
        loc = error.get("loc") if isinstance(error, dict) else None
        if (isinstance(loc, list) and len(loc) >= 2 and loc[0] == "body" and isinstance(loc[1], int)
                and not isinstance(loc[1], bool) and 0 <= loc[1] < pushed):
            found.add(loc[1])
    listed = answer.get("invalid_indices")
    if not isinstance(listed, list) or not listed or not found or len(listed) > pushed:
        return found
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < pushed for i in listed):
        return found
    named = set(listed)
    if len(named) != len(listed) or not found <= named:
        return found
    if len(described) < SERVER_MAX_LISTED_ERRORS and named != found:
        return found
    return named
