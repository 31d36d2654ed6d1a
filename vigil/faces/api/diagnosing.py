"""Background diagnosis in `vigil serve`: an incident stored without a diagnosis (a batch pipeline, an external
detector's POST, anything but the engine, which stores one when it opens its own) is diagnosed by a few threads
of the server as soon as it is seen, never inside a page or API request.

The work queue is the store itself: incidents with neither a diagnosis nor a live claim on one
(``Store.undiagnosed``), looked at every ``poll_s`` and whenever this server stores or shows such an incident, so
nothing is lost across restarts (a server starting picks up every incident still lacking a diagnosis, and a claim
left by a server that died is taken over once its lease lapses). Each diagnosis is claimed in the database first
(``Store.claim_diagnosis``: SQLite and PostgreSQL), so two servers, or a viewer's *Diagnose again* beside the
background, never run the same one twice. *Diagnose again* claims the rerun in its request (409 while one runs)
and runs it on a thread of its own, answering at once. A failed one is stored with its error and tried again by
the background threads up to ``retries`` times, ``retry_s`` after the failure and twice as long after each further
one (the claim ``retrying``); then it waits for *Diagnose again*.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from vigil.model import Diagnosis, VigilConflictError
from vigil.run.engine import engine_owner

if TYPE_CHECKING:
    from vigil.store.sql import Store

log = logging.getLogger(__name__)

DiagnosisState = Literal["done", "pending", "running", "retrying", "failed", "off"]


class DiagnosisStatus(BaseModel):
    """Where an incident's diagnosis stands: ``done`` (stored), ``pending`` (queued for the background threads),
    ``running`` (claimed by a server now: a first diagnosis, a retry or a rerun beside the stored one),
    ``retrying`` (failed ``failures`` times, ``error`` says why; tried again at ``retry_at``), ``failed`` (its
    retries spent; *Diagnose again* reruns it) or ``off`` (no diagnosis and background diagnosis is off on this
    server). ``attempts`` counts the runs claimed since the incident was first diagnosed here."""

    incident_id: str
    state: DiagnosisState
    pending: bool
    error: str = ""
    attempts: int = 0
    failures: int = 0
    retries: int = 0
    retry_at: float | None = None
    started: float | None = None


class DiagnosisQueued(DiagnosisStatus):
    """What *Diagnose again* answers (202): the rerun claimed, running, and where to ask how it stands."""

    status_url: str


class RerunNotStarted(RuntimeError):
    """*Diagnose again* claimed the rerun but could not start a thread to run it (the process is out of threads):
    the claim is released again, for another server or a later request (HTTP 503)."""


class DiagnosisWorker:
    """``threads`` daemon threads diagnosing what ``store.undiagnosed`` lists, through ``compute`` (which
    works the diagnosis out without storing it), plus one renewing the leases of the claims they hold."""

    def __init__(self, store: Store, compute: Callable[[str], Diagnosis], *, threads: int = 1,
                 lease_s: float = 60.0, poll_s: float = 2.0, owner: str | None = None, retries: int = 3,
                 retry_s: float = 30.0, rerun_threads: int | None = None) -> None:
        self.store = store
        self.compute = compute
        self.threads = threads
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.retries = retries
        self.retry_s = retry_s
        # named as the engine names its lease (host and pid namespace, pid, token), the token this worker's own
        self.owner = owner or engine_owner(secrets.token_hex(8))
        self._wake = threading.Condition()
        self._wanted: deque[str] = deque()
        self._holding: set[str] = set()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self._renewer: threading.Thread | None = None
        # *Diagnose again*: claimed in the request, queued here, run by at most ``rerun_threads`` threads (each
        # ends once the queue is empty), so a burst of reruns across many incidents holds a bounded number of
        # threads and diagnoses at once
        self.rerun_threads = max(1, threads) if rerun_threads is None else max(1, rerun_threads)
        self._rerun_queue: deque[tuple[str, int]] = deque()
        self._reruns: set[threading.Thread] = set()
        self._started = False
        self._failures = 0

    @property
    def enabled(self) -> bool:
        return self.threads > 0

    @property
    def retries_here(self) -> int:
        """How many times a failure stored here is tried again: none on a server without background threads,
        where nothing reads the retries due (it waits for *Diagnose again*, failed, rather than "retrying" for
        good)."""
        return self.retries if self.enabled else 0

    def start(self) -> None:
        """Start the threads (once; a no-op when ``threads`` is 0)."""
        with self._wake:
            if self._started or not self.enabled:
                return
            self._started = True
            self._stop.clear()
            for n in range(self.threads):
                self._workers.append(threading.Thread(target=self._loop, name=f"vigil-diagnose-{n}", daemon=True))
        for thread in self._workers:
            thread.start()
        self._renewing()

    def stop(self, wait_s: float = 5.0) -> None:
        """Stop taking work; wait up to ``wait_s`` for a diagnosis under way (one left running past it is a
        daemon's: its claim lapses and another server takes it over)."""
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
            threads = [*self._workers, *self._reruns, *([self._renewer] if self._renewer else [])]
        for thread in threads:
            thread.join(wait_s)
        with self._wake:
            self._workers = []
            self._renewer = None
            self._started = False

    def want(self, incident_id: str) -> None:
        """Diagnose ``incident_id`` next (an incident just stored or being looked at). Only a started worker
        (the server's, from its start-up) takes it: a short-lived reader of the store (`vigil ask`'s tools)
        queues nothing that dies with it, and the server's own poll finds the incident anyway."""
        if not self.enabled:
            return
        with self._wake:
            if not self._started:
                return
            if incident_id not in self._wanted:
                self._wanted.appendleft(incident_id)
            self._wake.notify()

    def holding(self, incident_id: str) -> bool:
        with self._wake:
            return incident_id in self._holding

    # ------------------------------------------------------------------ running one

    def run(self, incident_id: str, *, again: bool = False) -> Diagnosis | None:
        """Claim and run one diagnosis here; None when another holds it or (without ``again``) it is not
        wanted any more. A failure is stored as the claim's error (retried later while retries are left) and
        raised."""
        attempt = self._claim(incident_id, again=again)
        if attempt is None:
            return None
        return self._execute(incident_id, attempt, again=again)

    def rerun(self, incident_id: str) -> int:
        """*Diagnose again*: claim the rerun now (VigilConflictError while a live one runs) and queue it for the
        rerun threads (at most ``rerun_threads``; its claim renewed while it waits); the claim's attempt number,
        at once. Its end is stored as a background one's is. RerunNotStarted, the claim released, when no thread
        could be started to run it."""
        attempt = self._claim(incident_id, again=True)
        assert attempt is not None
        try:
            self._renewing()
        except RuntimeError as err:  # "can't start new thread": nothing would keep its claim
            self._release(incident_id, attempt, err)
        failed: RuntimeError | None = None
        with self._wake:
            self._holding.add(incident_id)  # renewed from now: it has not begun
            self._rerun_queue.append((incident_id, attempt))
            if len(self._reruns) < self.rerun_threads:
                # started under the lock, so a rerun queued meanwhile never waits on a thread that did not start
                thread = threading.Thread(target=self._rerun_loop, name=f"vigil-rediagnose-{len(self._reruns)}",
                                          daemon=True)
                try:
                    thread.start()
                except RuntimeError as err:  # nothing would run it: taken back
                    self._rerun_queue.remove((incident_id, attempt))
                    self._holding.discard(incident_id)
                    failed = err
                else:
                    self._reruns.add(thread)
        if failed is not None:
            self._release(incident_id, attempt, failed)
        return attempt

    def _release(self, incident_id: str, attempt: int, err: RuntimeError) -> None:
        """Release the claim of a rerun that no thread runs: held, it would turn every later *Diagnose again* away
        (409) and keep the incident from the background threads."""
        self.store.release_diagnosis(incident_id, self.owner, attempt)
        raise RerunNotStarted(f"incident {incident_id!r}: the rerun could not start on this server ({err}); "
                              "try again later") from err

    def _rerun_loop(self) -> None:
        me = threading.current_thread()
        while True:
            with self._wake:
                if not self._rerun_queue:
                    self._reruns.discard(me)
                    return
                incident_id, attempt = self._rerun_queue.popleft()
            try:
                self._execute(incident_id, attempt, again=True)
            except Exception as err:  # stored with the claim for the status route and the page
                log.warning("incident %s: diagnosis asked for again failed: %s", incident_id, err)

    def _claim(self, incident_id: str, *, again: bool) -> int | None:
        attempt = self.store.claim_diagnosis(incident_id, self.owner, self.lease_s, again=again)
        if attempt is None and again:
            claim = self.store.diagnosis_claim(incident_id)
            owner = claim.owner if claim else "another server"
            raise VigilConflictError(f"incident {incident_id!r} is being diagnosed now ({owner}); its "
                                     "diagnosis is stored when done")
        return attempt

    def _renewing(self) -> None:
        """Start the thread renewing the leases of the claims held here, once (a server without background
        threads renews its reruns' claims too)."""
        with self._wake:
            if self._renewer is not None and self._renewer.is_alive():
                return
            self._stop.clear()
            renewer = threading.Thread(target=self._renew, name="vigil-diagnose-lease", daemon=True)
            renewer.start()  # kept only once started: ``stop`` joins it
            self._renewer = renewer

    def _execute(self, incident_id: str, attempt: int, *, again: bool) -> Diagnosis | None:
        """Run the diagnosis claimed as ``attempt`` and store its end."""
        with self._wake:
            self._holding.add(incident_id)
        try:
            try:
                found = self.compute(incident_id)
            except KeyError:  # the incident is gone: nothing to try again
                self.store.finish_diagnosis(incident_id, self.owner, None, error=f"no incident {incident_id!r}",
                                            again=again, attempt=attempt)
                raise
            except Exception as err:  # stored for the page, then raised for the caller
                self.store.finish_diagnosis(incident_id, self.owner, None,
                                            error=str(err) or type(err).__name__, again=again, attempt=attempt,
                                            retries=self.retries_here, retry_s=self.retry_s)
                raise
            if not self.store.finish_diagnosis(incident_id, self.owner, found, again=again, attempt=attempt):
                log.warning("incident %s: the claim on its diagnosis lapsed and was taken over; this result is "
                            "dropped", incident_id)
                return None
            return found
        finally:
            with self._wake:
                self._holding.discard(incident_id)
                self._wake.notify_all()

    # ------------------------------------------------------------------ threads

    def _next(self) -> list[str]:
        with self._wake:
            if self._wanted:
                return [self._wanted.popleft()]
        return self.store.undiagnosed(limit=max(4, 2 * self.threads))

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                candidates = self._next()
                ran = False
                for incident_id in candidates:
                    if self._stop.is_set():
                        return
                    try:
                        ran = self.run(incident_id) is not None or ran
                    except Exception as err:  # stored with the claim; the loop goes on
                        ran = True
                        log.warning("incident %s: diagnosis failed: %s", incident_id, err)
                    if ran:
                        break
                self._failures = 0
            except Exception as err:  # the store unreachable: back off, keep the threads
                self._failures += 1
                if self._failures == 1:
                    log.warning("background diagnosis cannot read the store: %s", err)
                ran = False
            if ran:
                continue
            with self._wake:
                if not self._wanted and not self._stop.is_set():
                    self._wake.wait(self.poll_s * min(2 ** self._failures, 30))

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            with self._wake:
                held = set(self._holding)
            if not held:
                continue
            try:
                self.store.renew_diagnosis_claims(self.owner, held, self.lease_s)
            except Exception as err:
                log.warning("cannot renew the claims on diagnoses of %s: %s", sorted(held), err)


def diagnosis_status(store: Store, worker: DiagnosisWorker, incident_id: str) -> DiagnosisStatus:
    """What the page and the API say of ``incident_id``'s diagnosis (the incident is known to exist)."""
    claim = store.diagnosis_claim(incident_id)
    counts: dict[str, Any] = {"attempts": claim.attempts, "failures": claim.failures} if claim else {}
    counts["retries"] = worker.retries_here
    if store.diagnosis(incident_id) is not None:
        if claim is not None and claim.state == "running" and claim.lease_until >= time.time():
            # *Diagnose again* under way: the stored diagnosis is replaced when it is done
            return DiagnosisStatus(incident_id=incident_id, state="running", pending=True, started=claim.claimed_at,
                                   **counts)
        # a rerun that failed left the diagnosis before it in place; its error is still told
        return DiagnosisStatus(incident_id=incident_id, state="done", pending=False,
                               error=claim.error if claim is not None and claim.state == "failed" else "", **counts)
    if claim is not None and claim.state == "failed":
        return DiagnosisStatus(incident_id=incident_id, state="failed", pending=False, error=claim.error,
                               started=claim.claimed_at, **counts)
    if claim is not None and claim.state == "retrying":
        return DiagnosisStatus(incident_id=incident_id, state="retrying", pending=True, error=claim.error,
                               retry_at=claim.lease_until, started=claim.claimed_at, **counts)
    if claim is not None and claim.state == "running" and claim.lease_until >= time.time():
        return DiagnosisStatus(incident_id=incident_id, state="running", pending=True, started=claim.claimed_at,
                               **counts)
    # a lapsed or released running claim is work for whichever server takes it next
    if not worker.enabled:
        return DiagnosisStatus(incident_id=incident_id, state="off", pending=False,
                               error="not diagnosed yet, and background diagnosis is off on this server "
                               "(serve_diagnosis_threads = 0): Diagnose again runs it")
    return DiagnosisStatus(incident_id=incident_id, state="pending", pending=True, **counts)
