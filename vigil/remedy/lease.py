"""Leases on the execution journal's claims: an owner keeps its claim on a run alive while the action runs.

A claim (``AuditLog.begin`` / ``AuditLog.claim``) holds until ``lease_expires``; another process may take the run
over only after that (``Remediator.recover``). While the back end works - a drain evicting pod after pod may take
minutes - a ``Renewal`` extends the lease every ``renew_s`` (10 s of 30 by default; settings remedy_lease_s and
remedy_lease_renew_s) on a daemon thread, so a live owner never looks dead, and a killed one's claim lapses within
one lease. A renewal the database refuses (it is briefly away) is logged and tried again at the next interval; a
renewal that finds the run another process's (it took the run over after the lease lapsed) ends the renewals.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TypedDict

from sqlalchemy.exc import SQLAlchemyError

from vigil.config import Settings
from vigil.remedy.audit import AuditLog

log = logging.getLogger("vigil.remedy.lease")

# wait(stop, seconds): block until ``stop`` is set (True) or ``seconds`` of the clock have passed (False)
Wait = Callable[[threading.Event, float], bool]


class LeaseTimes(TypedDict):
    """How long a remediator's claim on a run holds (``lease_s``) and how often it renews it (``renew_s``)."""

    lease_s: float
    renew_s: float


# the settings' defaults, for a remediator its caller gives no lease (a test, a library use)
DEFAULT_LEASE_S: float = Settings.model_fields["remedy_lease_s"].default
DEFAULT_RENEW_S: float = Settings.model_fields["remedy_lease_renew_s"].default


def lease_of(settings: Settings) -> LeaseTimes:
    """The lease and renewal of ``settings`` (remedy_lease_s, remedy_lease_renew_s), as a remediator takes them:
    ``Remediator(..., **lease_of(settings))``."""
    return {"lease_s": settings.remedy_lease_s, "renew_s": settings.remedy_lease_renew_s}


def wall_wait(stop: threading.Event, seconds: float) -> bool:
    return stop.wait(seconds)


class Renewal:
    """``with Renewal(...):`` renews ``owner``'s claim on the run under ``key`` until the block ends, or until a
    renewal finds the run no longer this owner's (it stalled past its lease and another process took it over)."""

    def __init__(self, audit: AuditLog, key: str, owner: str, *, lease_s: float, renew_s: float,
                 clock: Callable[[], float], wait: Wait = wall_wait) -> None:
        self.audit, self.key, self.owner = audit, key, owner
        self.lease_s, self.renew_s, self.clock, self.wait = lease_s, renew_s, clock, wait
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"vigil-lease-{key}"[:60], daemon=True)

    def __enter__(self) -> Renewal:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    def _renew(self) -> None:
        while not self.wait(self._stop, self.renew_s):
            try:
                held = self.audit.renew(self.key, self.owner, self.clock() + self.lease_s)
            except SQLAlchemyError as err:
                log.warning("renewing the lease on run %s failed, trying again in %g s: %s", self.key, self.renew_s,
                            err)
                continue
            if not held:
                # the run's close (AuditLog.finish on this owner) finds it lost too, and records a late answer
                log.warning("run %s is no longer %s's: its lease lapsed and another process took the run over",
                            self.key, self.owner)
                return
