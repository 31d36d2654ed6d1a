"""Diagnosis claims moved in time as the clock passing them would, for the claim tests of the store and the
server."""

from __future__ import annotations


def set_lease(store: object, incident_id: str, until: float) -> None:
    """Move a claim's time (its lease, or when it is due again) as the clock passing it would."""
    from sqlalchemy import update

    from vigil.store import schema as tables

    with store.engine.begin() as conn:  # type: ignore[attr-defined]
        conn.execute(update(tables.diagnosis_claims).where(tables.diagnosis_claims.c.incident_id == incident_id)
                     .values(lease_until=until))
