"""Claims on background diagnoses (revision 0012) on SQLite and the suite's PostgreSQL: of concurrent claimers -
threads on their own connections, as two servers are - exactly one gets an incident, a lapsed claim is taken over
and its former owner's late result dropped, a failed one waits for a rerun, and two workers over one database
diagnose each incident once."""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter

import pytest

from tests.store.conftest import db_url as db_url
from tests.store.conftest import opened
from tests.store.diagnosis_leases import set_lease
from vigil.faces.api.diagnosing import DiagnosisWorker, RerunNotStarted
from vigil.model import Diagnosis, FaultLevel, Incident, IncidentStatus, VigilConflictError
from vigil.remedy.commands import this_host
from vigil.run import engine as engine_module
from vigil.run.engine import engine_owner

pytestmark = pytest.mark.timeout(180)


def incident(n: int, start: float = 1000.0, status: IncidentStatus = IncidentStatus.OPEN) -> Incident:
    return Incident(id=f"inc-{n:03d}", start=start + n, end=start + n + 60, level=FaultLevel.DRAIN, status=status,
                    scope=f"gpu/n{n:03d}/0", entities=[f"gpu/n{n:03d}/0"], fault_types=["xid_79"],
                    title=f"GPU fell off the bus on n{n:03d}")


def found(incident_id: str, by: str = "worker") -> Diagnosis:
    return Diagnosis(incident_id=incident_id, summary=f"diagnosed by {by}", root_cause=None, confidence=0.5)


def test_of_concurrent_claimers_exactly_one_gets_each_incident(db_url: str) -> None:
    claimers, incidents = 6, 12
    with opened(db_url) as store:
        for n in range(incidents):
            store.create_incident(incident(n))
    stores = [opened(db_url) for _ in range(claimers)]
    opened_stores = [s.__enter__() for s in stores]
    won: Counter[str] = Counter()
    lock = threading.Lock()
    start = threading.Barrier(claimers)

    def claim(k: int) -> None:
        start.wait()
        for n in range(incidents):
            if opened_stores[k].claim_diagnosis(f"inc-{n:03d}", f"owner-{k}", 60.0):
                with lock:
                    won[f"inc-{n:03d}"] += 1

    try:
        threads = [threading.Thread(target=claim, args=(k,)) for k in range(claimers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert won == {f"inc-{n:03d}": 1 for n in range(incidents)}
        # held: none claims it again, not even a rerun, until its owner finishes or its lease lapses
        assert not opened_stores[0].claim_diagnosis("inc-000", "late", 60.0)
        assert not opened_stores[0].claim_diagnosis("inc-000", "late", 60.0, again=True)
        assert opened_stores[0].undiagnosed() == []
    finally:
        for s in stores:
            s.__exit__(None, None, None)


def test_a_lapsed_claim_is_taken_over_and_the_late_result_dropped(db_url: str) -> None:
    with opened(db_url) as store:
        store.create_incident(incident(1))
        assert store.claim_diagnosis("inc-001", "dead-server", -1.0)  # its lease already lapsed
        assert store.undiagnosed() == ["inc-001"]
        assert store.claim_diagnosis("inc-001", "new-server", 60.0)
        claim = store.diagnosis_claim("inc-001")
        assert claim is not None and (claim.owner, claim.state, claim.attempts) == ("new-server", "running", 2)
        assert not store.finish_diagnosis("inc-001", "dead-server", found("inc-001", "dead-server"))
        assert store.diagnosis("inc-001") is None
        assert store.finish_diagnosis("inc-001", "new-server", found("inc-001", "new-server"))
        stored = store.diagnosis("inc-001")
        assert stored is not None and stored.summary == "diagnosed by new-server"
        assert not store.claim_diagnosis("inc-001", "third", 60.0)  # done: only a rerun claims it
        assert store.claim_diagnosis("inc-001", "third", 60.0, again=True)
        assert store.finish_diagnosis("inc-001", "third", found("inc-001", "rerun"), again=True)
        stored = store.diagnosis("inc-001")
        assert stored is not None and stored.summary == "diagnosed by rerun"


def test_a_failure_is_kept_with_its_error_and_waits_for_a_rerun(db_url: str) -> None:
    with opened(db_url) as store:
        store.create_incident(incident(1))
        store.create_incident(incident(2, status=IncidentStatus.RESOLVED))
        store.create_incident(incident(3))
        assert store.undiagnosed() == ["inc-003", "inc-001", "inc-002"]  # unresolved first, newest first
        assert store.claim_diagnosis("inc-001", "a", 60.0)
        assert store.finish_diagnosis("inc-001", "a", None, error="no topology")
        claim = store.diagnosis_claim("inc-001")
        assert claim is not None and (claim.state, claim.error) == ("failed", "no topology")
        assert store.undiagnosed() == ["inc-003", "inc-002"]
        assert not store.claim_diagnosis("inc-001", "b", 60.0)
        assert store.claim_diagnosis("inc-001", "b", 60.0, again=True)


def test_a_diagnosis_stored_meanwhile_by_another_writer_is_kept(db_url: str) -> None:
    with opened(db_url) as store:
        store.create_incident(incident(1))
        assert store.claim_diagnosis("inc-001", "server", 60.0)
        store.save_diagnosis(found("inc-001", "engine"))  # the engine's own, stored while the server ran
        assert store.finish_diagnosis("inc-001", "server", found("inc-001", "server"))
        stored = store.diagnosis("inc-001")
        assert stored is not None and stored.summary == "diagnosed by engine"


def test_two_workers_over_one_database_diagnose_each_incident_once(db_url: str) -> None:
    incidents = 10
    with opened(db_url) as store:
        for n in range(incidents):
            store.create_incident(incident(n))
    ran: Counter[str] = Counter()
    lock = threading.Lock()

    def compute(incident_id: str) -> Diagnosis:
        with lock:
            ran[incident_id] += 1
        return found(incident_id)

    with opened(db_url) as one, opened(db_url) as two:
        workers = [DiagnosisWorker(s, compute, threads=2, poll_s=0.05) for s in (one, two)]
        for worker in workers:
            worker.start()
        try:
            def missing() -> list[str]:
                return [f"inc-{n:03d}" for n in range(incidents) if one.diagnosis(f"inc-{n:03d}") is None]

            deadline = time.monotonic() + 60
            while missing() and time.monotonic() < deadline:
                time.sleep(0.05)  # polling the stored diagnoses with a deadline
            assert missing() == []
        finally:
            for worker in workers:
                worker.stop()
        assert ran == {f"inc-{n:03d}": 1 for n in range(incidents)}
        assert all(one.diagnosis(f"inc-{n:03d}") is not None for n in range(incidents))


def test_a_late_result_of_a_lapsed_claim_is_dropped_when_the_same_server_took_it_over(db_url: str) -> None:
    # One server's owner name is the same on all its claims: a claim of its own that lapsed (the process stalled
    # past the lease) and that it took again - another of its threads, or *Diagnose again* - is told apart by the
    # attempt number claim_diagnosis answers, so the stale run's late result is dropped, not stored over the new.
    with opened(db_url) as store:
        store.create_incident(incident(1))
        stale = store.claim_diagnosis("inc-001", "server", -1.0)  # its lease already lapsed
        assert stale == 1
        fresh = store.claim_diagnosis("inc-001", "server", 60.0)
        assert fresh == 2
        assert not store.finish_diagnosis("inc-001", "server", found("inc-001", "stale run"), attempt=stale)
        assert store.diagnosis("inc-001") is None
        claim = store.diagnosis_claim("inc-001")
        assert claim is not None and (claim.state, claim.attempts) == ("running", 2)
        assert store.finish_diagnosis("inc-001", "server", found("inc-001", "fresh run"), attempt=fresh)
        stored = store.diagnosis("inc-001")
        assert stored is not None and stored.summary == "diagnosed by fresh run"
        # a failure of the stale run is dropped the same way: it does not mark the stored diagnosis failed
        again = store.claim_diagnosis("inc-001", "server", -1.0, again=True)
        assert again == 3
        assert store.claim_diagnosis("inc-001", "server", 60.0) is None  # diagnosed: only a rerun takes it
        rerun = store.claim_diagnosis("inc-001", "server", 60.0, again=True)
        assert rerun == 4
        assert not store.finish_diagnosis("inc-001", "server", None, error="stale failure", attempt=again)
        claim = store.diagnosis_claim("inc-001")
        assert claim is not None and (claim.state, claim.error) == ("running", "")


def test_a_failed_diagnosis_is_retried_a_bounded_number_of_times_each_later(db_url: str) -> None:
    with opened(db_url) as store:
        store.create_incident(incident(1))
        store.create_incident(incident(2))
        tries: list[tuple[str, int, float]] = []
        for n in range(1, 4):
            attempt = store.claim_diagnosis("inc-001", "w", 60.0)
            assert attempt == n
            before = time.time()
            assert store.finish_diagnosis("inc-001", "w", None, error=f"boom {n}", attempt=attempt, retries=2,
                                          retry_s=100.0)
            claim = store.diagnosis_claim("inc-001")
            assert claim is not None and claim.failures == n and claim.error == f"boom {n}"
            tries.append((claim.state, claim.failures, claim.lease_until - before))
            if claim.state == "retrying":
                # not due yet: neither listed nor claimed; due (its time moved to the past): both
                assert "inc-001" not in store.undiagnosed()
                assert store.claim_diagnosis("inc-001", "w", 60.0) is None
                set_lease(store, "inc-001", time.time() - 1)
                assert "inc-001" in store.undiagnosed()
        # twice tried again, 100 s then 200 s after the failure; the third failure is final
        assert [(state, failures) for state, failures, _ in tries] == [("retrying", 1), ("retrying", 2), ("failed", 3)]
        assert 100.0 <= tries[0][2] < 110.0 and 200.0 <= tries[1][2] < 210.0
        assert "inc-001" not in store.undiagnosed() and store.claim_diagnosis("inc-001", "w", 60.0) is None
        # Diagnose again starts the count over; its success is stored and the attempts stay counted
        attempt = store.claim_diagnosis("inc-001", "viewer", 60.0, again=True)
        assert attempt == 4
        claim = store.diagnosis_claim("inc-001")
        assert claim is not None and (claim.state, claim.failures) == ("running", 0)
        assert store.finish_diagnosis("inc-001", "viewer", found("inc-001"), again=True, attempt=attempt)
        claim = store.diagnosis_claim("inc-001")
        assert claim is not None and (claim.state, claim.attempts, claim.failures) == ("done", 4, 0)
        # a rerun failing beside a stored diagnosis is not retried: the stored one stands
        attempt = store.claim_diagnosis("inc-001", "viewer", 60.0, again=True)
        assert store.finish_diagnosis("inc-001", "viewer", None, error="boom", again=True, attempt=attempt,
                                      retries=2)
        claim = store.diagnosis_claim("inc-001")
        assert claim is not None and claim.state == "failed" and store.diagnosis("inc-001") is not None
        # a retrying claim's late result from the owner it lapsed from is dropped
        first = store.claim_diagnosis("inc-002", "a", 60.0)
        assert store.finish_diagnosis("inc-002", "a", None, error="x", attempt=first, retries=1, retry_s=100.0)
        set_lease(store, "inc-002", time.time() - 1)
        second = store.claim_diagnosis("inc-002", "b", 60.0)
        assert second == 2 and not store.finish_diagnosis("inc-002", "a", found("inc-002"), attempt=first)
        assert store.finish_diagnosis("inc-002", "b", found("inc-002"), attempt=second)
        claim = store.diagnosis_claim("inc-002")
        assert claim is not None and (claim.state, claim.owner, claim.failures) == ("done", "b", 1)


def test_reruns_asked_for_at_once_run_on_a_bounded_number_of_threads(db_url: str) -> None:
    asked, bound = 6, 2
    release = threading.Event()
    ran: list[str] = []

    def compute(incident_id: str) -> Diagnosis:
        assert release.wait(60)
        ran.append(incident_id)
        return found(incident_id, "rerun")

    with opened(db_url) as store:
        for n in range(asked):
            store.create_incident(incident(n))
        worker = DiagnosisWorker(store, compute, threads=0, rerun_threads=bound)
        try:
            attempts = [worker.rerun(f"inc-{n:03d}") for n in range(asked)]
            assert attempts == [1] * asked  # each claimed in its request, queued or running
            rerunning = [t for t in threading.enumerate() if t.name.startswith("vigil-rediagnose")]
            assert len(rerunning) <= bound
            # a queued rerun's claim is held (renewed) like a running one's: no other server takes it over
            assert all(store.diagnosis_claim(f"inc-{n:03d}").state == "running" for n in range(asked))
            release.set()
            deadline = time.monotonic() + 60
            while any(store.diagnosis(f"inc-{n:03d}") is None for n in range(asked)):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert sorted(ran) == [f"inc-{n:03d}" for n in range(asked)]
        finally:
            release.set()
            worker.stop()


def test_a_failed_rerun_on_a_server_without_background_threads_is_failed_not_left_retrying(db_url: str) -> None:
    # nothing on such a server tries it again (only the background threads read the due retries): "retrying"
    # would be told, and polled by the page, for good
    def compute(incident_id: str) -> Diagnosis:
        raise RuntimeError("the knowledge graph is unreadable")

    with opened(db_url) as store:
        store.create_incident(incident(1))
        worker = DiagnosisWorker(store, compute, threads=0, retries=3, retry_s=0.01)
        try:
            worker.rerun("inc-001")
            deadline = time.monotonic() + 60
            while (claim := store.diagnosis_claim("inc-001")) is None or claim.state == "running":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert (claim.state, claim.failures, claim.error) == ("failed", 1, "the knowledge graph is unreadable")
        finally:
            worker.stop()


def test_a_claim_names_its_server_as_the_engine_lease_does(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim's owner is host and pid namespace, pid and a token (``engine_owner``): two containers on one host
    name with the same pid are two owners, and a rerun turned away names the server holding the claim."""
    with opened(db_url) as store:
        store.create_incident(incident(1))
        worker = DiagnosisWorker(store, found)
        where, pid, token = worker.owner.rsplit(":", 2)
        assert where == this_host() and pid == str(os.getpid()) and worker.owner == engine_owner(token)
        assert DiagnosisWorker(store, found).owner != worker.owner  # each worker a token of its own
        host = this_host().partition(" ")[0]
        monkeypatch.setattr(engine_module, "this_host", lambda: f"{host} pid:[1]")
        twin = DiagnosisWorker(store, found)
        assert twin.owner.startswith(f"{host} pid:[1]:{os.getpid()}:")
        assert store.claim_diagnosis("inc-001", worker.owner, 60.0) == 1
        with pytest.raises(VigilConflictError, match=re.escape(f"({worker.owner})")):
            twin.rerun("inc-001")


def test_a_released_claim_is_not_held_again_by_a_renewal_read_before_the_release(db_url: str) -> None:
    """The renewing thread reads the claims held, then renews them: a rerun released between the two (its thread
    did not start) stays released, for any server to take now - not held another lease with nothing running it."""
    with opened(db_url) as store:
        store.create_incident(incident(1))
        attempt = store.claim_diagnosis("inc-001", "server", 60.0, again=True)
        assert attempt == 1 and store.release_diagnosis("inc-001", "server", attempt)
        assert store.renew_diagnosis_claims("server", {"inc-001"}, 60.0) == 0
        claim = store.diagnosis_claim("inc-001")
        assert claim is not None and claim.lease_until < time.time()
        assert store.undiagnosed() == ["inc-001"]
        assert store.claim_diagnosis("inc-001", "other", 60.0) == 1  # the released attempt was not counted
        assert store.finish_diagnosis("inc-001", "other", found("inc-001"), attempt=1)
        rerun = store.claim_diagnosis("inc-001", "server", 60.0, again=True)
        assert rerun == 2 and store.release_diagnosis("inc-001", "server", rerun)
        claim = store.diagnosis_claim("inc-001")
        assert claim is not None and claim.attempts == 1
        assert store.claim_diagnosis("inc-001", "server", 60.0, again=True) == 2


def test_a_rerun_queued_behind_a_rerun_thread_that_did_not_start_is_run(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two reruns asked for at once with one rerun thread allowed: the second, queued while the first's new thread
    was not yet started, is not left behind a thread that then fails to start - held and renewed for good with
    nothing to run it, every later Diagnose again turned away. It runs; the first is released (503)."""
    with opened(db_url) as store:
        store.create_incident(incident(1))
        store.create_incident(incident(2))
        worker = DiagnosisWorker(store, found, threads=0, rerun_threads=1)
        start = threading.Thread.start
        queued: list[int] = []
        asked = threading.Event()

        def second_asked_meanwhile(thread: threading.Thread) -> None:
            if thread.name.startswith("vigil-rediagnose-") and not asked.is_set():
                asked.set()
                queued.append(worker.rerun("inc-002"))  # asked for while the first one's thread is not started
                raise RuntimeError("can't start new thread")
            start(thread)

        monkeypatch.setattr(threading.Thread, "start", second_asked_meanwhile)
        try:
            with pytest.raises(RerunNotStarted):
                worker.rerun("inc-001")
            monkeypatch.undo()
            assert queued == [1]
            deadline = time.monotonic() + 60
            while store.diagnosis("inc-002") is None and time.monotonic() < deadline:
                with worker._wake:
                    worker._wake.wait(0.5)  # woken when a diagnosis here ends
            assert store.diagnosis("inc-002") is not None, store.diagnosis_claim("inc-002")
            assert not worker.holding("inc-002") and not worker.holding("inc-001")
            assert store.undiagnosed() == ["inc-001"]
        finally:
            worker.stop()
