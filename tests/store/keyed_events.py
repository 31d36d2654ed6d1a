"""Checks of events written under push keys, run on SQLite by the store's tests and on PostgreSQL by the server's:
a batch counts only what it wrote, and of two racing writes of the same keys only one counts them."""

from __future__ import annotations

from vigil.model import Event
from vigil.store.sql import Store


def assert_a_batch_counts_the_events_it_wrote(url: str) -> None:
    """What ``add_events`` returns is what its one insert wrote: not a key stored already, not a key's second
    event in the batch; every event without a key is written."""
    store = Store(url)

    def line(i: int) -> Event:
        return Event(ts=100.0 + i, entity="job/llm/rank/1", kind="rank_log", message=f"line {i}")

    assert store.add_events([line(0), line(1)], ["k0", "k1"]) == 2
    batch = [line(0), line(2), line(2), line(3), line(3), line(4)]
    assert store.add_events(batch, ["k0", "k2", "k2", None, None, "k4"]) == 4
    assert store.add_events([line(5)]) == 1 and store.add_events([]) == 0
    assert [e.message for e in store.events(kind="rank_log")] == [
        "line 0", "line 1", "line 2", "line 3", "line 3", "line 4", "line 5"]
    store.close()


def assert_a_racing_write_of_the_same_keys_is_counted_once(url: str) -> None:
    """Two pushes of the same keyed events racing: the one whose insert comes second after both looked for the
    keys writes nothing, and says so (the route's ``duplicates``), rather than counting rows it did not write."""
    import sqlalchemy

    store, other = Store(url), Store(url)
    events = [Event(ts=100.0, entity="job/llm/rank/1", kind="rank_log", message=f"line {i}") for i in range(3)]
    keys = ["k0", "k1", "k2"]
    raced: list[int] = []

    def the_other_push_first(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        # between this push's look for its keys and its insert, the racing push stores two of them
        if statement.lstrip().upper().startswith("INSERT") and not raced:
            raced.append(other.add_events(events[:2], keys[:2]))

    sqlalchemy.event.listen(store.engine, "before_cursor_execute", the_other_push_first)
    try:
        written = store.add_events(events, keys)
    finally:
        sqlalchemy.event.remove(store.engine, "before_cursor_execute", the_other_push_first)
    assert raced == [2]
    assert written == 1
    assert sorted(e.message for e in store.events(kind="rank_log")) == ["line 0", "line 1", "line 2"]
    store.close()
    other.close()
