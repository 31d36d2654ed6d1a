"""The agent's events spool: the events queued for the server, on disk, written before they are sent and removed
once the server answered for them, so that an agent killed (or its node rebooted) sends them when it starts again -
against the server's real app on real HTTP, the agent a real process killed with SIGKILL - bounded by events and
bytes, and surviving a write torn by a crash."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.collect.conftest import (
    TOKEN,
    CountingSource,
    Switch,
    agent_process,
    died_writing,
    fast_settings,
    held_events,
    xid,
    xid_line,
)
from tests.conftest import wait_for
from tests.serve.conftest import serve_in_thread
from vigil.sources.collect.agent import SPOOL_FULL, Agent, AgentExposition
from vigil.sources.collect.spool import SPOOL_FILE, EventSpool


@pytest.mark.slow
def test_an_agent_killed_with_events_unsent_sends_them_after_its_restart_each_stored_once(tmp_path: Path) -> None:
    """50 Xid lines: the server stores the first 30 but its answer is lost (the agent keeps them), then is away
    while 20 more are read; the agent is killed (SIGKILL) and the node's kernel log is gone (a reboot). Started
    again against the server, the agent sends what its spool held: all 50 stored, each once - the 30 sent again are
    the server's duplicates (before: the 20 never stored were lost with the process)."""
    from vigil.config import Settings
    from vigil.faces.api.app import create_app
    from vigil.store.sql import Store

    settings = Settings(home=tmp_path / "home", api_token=TOKEN)
    store = Store(settings.database_url())
    switch = Switch(create_app(store, settings=settings))
    kmsg, state = tmp_path / "kern.log", tmp_path / "state"
    lines = [xid_line(i) for i in range(50)]

    def stored() -> list[str]:
        return [e.message for e in store.events(kind="xid", limit=1000)]

    with serve_in_thread(switch) as url:
        switch.mode = "lost"
        kmsg.write_text("".join(lines[:30]))
        with agent_process(url, kmsg, state, tmp_path / "agent.log") as agent:
            wait_for(lambda: len(stored()) == 30 and held_events(state) == 30, 60,
                     "30 events stored, their answer lost")
            switch.mode = "down"
            with kmsg.open("a") as f:
                f.write("".join(lines[30:]))
            wait_for(lambda: held_events(state) == 50 and switch.events_posts[-1][0] == "down", 60,
                     "50 events spooled, the server away")
            agent.send_signal(signal.SIGKILL)
            agent.wait(timeout=30)
        assert len(stored()) == 30
        kmsg.unlink()
        kmsg.write_text("")  # the node rebooted: its kernel log holds none of them
        switch.mode = "up"
        with agent_process(url, kmsg, state, tmp_path / "agent.log") as agent:
            wait_for(lambda: held_events(state) == 0, 60, "the spool sent and emptied")
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=30) == 0
    messages = stored()
    assert len(messages) == 50, (tmp_path / "agent.log").read_text()[-3000:]
    assert all(sum(m.endswith(f"Graphics Exception {i}") for m in messages) == 1 for i in range(50)), messages
    assert ("up", 0) in switch.events_posts
    store.close()


def test_events_are_on_disk_before_they_are_sent_and_off_it_once_answered(tmp_path: Path) -> None:
    """The spool holds a new event as soon as it is queued and until the server has answered for it: kept while
    the server fails, forgotten once it took the event - or refused it for good, since sending it again cannot
    help."""
    state = tmp_path / "state"
    answers = {"status": 503}
    seen: list[int] = []

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            seen.append(len(json.loads(request.content)))
            return httpx.Response(answers["status"], json={"detail": "no"})
        return httpx.Response(201, json={"stored": 1, "duplicates": 0})

    agent = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", server_token=TOKEN,
                                                    state_dir=str(state)), cpu_ratio=lambda: 0.1)
    pusher = agent._pusher
    assert pusher is not None and agent.spool is not None
    pusher._client = httpx.Client(transport=httpx.MockTransport(server))
    agent._accept_events([xid(1.0), xid(2.0)])
    assert held_events(state) == 2
    _round(agent)
    assert held_events(state) == 2 and [e.ts for e in agent.pending_events] == [1.0, 2.0]
    answers["status"] = 201
    _round(agent)
    assert held_events(state) == 0 and not agent.pending_events
    agent._accept_events([xid(3.0)])
    answers["status"] = 400
    _round(agent)
    assert held_events(state) == 0 and agent.events_batch_refused == 1
    agent.close()


def _round(agent: Agent) -> None:
    pusher = agent._pusher
    assert pusher is not None
    with agent._lock:
        batch, agent.pending_events = agent.pending_events, []
    pusher._post(batch, agent._requeue, [], agent.node, None, agent._settled)


def test_the_spool_is_bounded_by_events_and_bytes_dropping_the_oldest_counted(tmp_path: Path) -> None:
    """Beyond its bounds the spool drops its oldest events - from the queue too, and an event dropped while the push
    thread sends it is not queued again if that fails - counted as spool_full; an agent started again sends the
    newest ones it kept, oldest first."""
    state = tmp_path / "state"
    agent = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", state_dir=str(state),
                                                    spool_events=5), cpu_ratio=lambda: 0.1)
    pusher = agent._pusher
    assert pusher is not None
    pusher._client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    agent._accept_events([xid(float(i)) for i in range(3)])
    with agent._lock:
        in_flight, agent.pending_events = agent.pending_events, []
    agent._accept_events([xid(float(i)) for i in range(3, 7)])  # 0 and 1 dropped while in flight
    assert [e.ts for e in agent.pending_events] == [3.0, 4.0, 5.0, 6.0]
    pusher._post(in_flight, agent._requeue, [], agent.node, None, agent._settled)
    assert [e.ts for e in agent.pending_events] == [2.0, 3.0, 4.0, 5.0, 6.0]
    agent._accept_events([xid(7.0), xid(8.0)])
    assert [e.ts for e in agent.pending_events] == [4.0, 5.0, 6.0, 7.0, 8.0] and held_events(state) == 5
    assert agent.events_spool_dropped == 4
    metrics = {m.name: m for m in AgentExposition(agent).collect()}
    assert {s.labels["reason"]: s.value for s in metrics["vigil_agent_events_dropped"].samples
            if s.name.endswith("_total")}[SPOOL_FULL] == 4
    agent.close()
    again = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", state_dir=str(state),
                                                    spool_events=3), cpu_ratio=lambda: 0.1)
    assert [e.ts for e in again.pending_events] == [4.0, 5.0, 6.0, 7.0, 8.0]  # what it held, bounded next add
    again._accept_events([xid(9.0)])
    assert [e.ts for e in again.pending_events] == [7.0, 8.0, 9.0] and held_events(state) == 3
    again.close()
    small = EventSpool(tmp_path / "bytes", max_events=100, max_bytes=1024)
    sizes = [len(json.dumps(xid(float(i)).model_dump(mode="json"), separators=(",", ":"))) for i in range(10)]
    small.add([xid(float(i)) for i in range(10)])
    assert small.bytes <= 1024 and len(small) == 1024 // sizes[0] and small.bytes == sum(sizes[-len(small):])
    small.close()


def test_a_write_torn_by_a_crash_costs_only_that_write_and_an_unreadable_spool_is_moved_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The spool as a crash leaves it - its files copied while open, the last write's WAL frames cut short: it
    opens with every earlier write and takes new ones. A file that is no spool at all is moved aside with a warning
    and an empty spool started; a second agent on the same state directory spools to a file of its own."""
    live = EventSpool(tmp_path / "live", 100, 2**20)
    live.add([xid(1.0), xid(2.0)])
    live.add([xid(3.0)])
    live.add([xid(4.0), xid(5.0)])
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    for name in (SPOOL_FILE, SPOOL_FILE + "-wal"):
        shutil.copy(tmp_path / "live" / name, crashed / name)
    beside = EventSpool(tmp_path / "live", 100, 2**20)  # the directory's spool is held by the first
    assert beside.path != live.path and beside.path.parent == live.path.parent
    beside.close()
    assert not beside.path.exists()  # left empty: removed
    live.close()
    wal = crashed / (SPOOL_FILE + "-wal")
    os.truncate(wal, wal.stat().st_size - 100)  # the last transaction's frames torn
    spool = EventSpool(crashed, 100, 2**20)
    assert [e.ts for _, e in spool.load()] == [1.0, 2.0, 3.0]
    spool.add([xid(6.0)])
    spool.close()
    assert [e.ts for _, e in EventSpool(crashed, 100, 2**20).load()] == [1.0, 2.0, 3.0, 6.0]
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / SPOOL_FILE).write_bytes(b"not a database\n" * 100)
    spool = EventSpool(garbage, 100, 2**20)
    assert spool.load() == [] and "moved aside" in caplog.text
    assert any(p.name.startswith(SPOOL_FILE + ".corrupt-") for p in garbage.iterdir())
    spool.close()


def test_a_damaged_spool_of_its_own_is_moved_aside_as_it_was_before_anything_writes_to_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The agent's own spool file cut to half its length, its WAL holding 10 more events: at start it is found
    damaged read-only and moved aside to ``<name>.corrupt-<time>`` with its WAL, both byte for byte as they were,
    in one warning line naming it; the agent starts an empty spool that takes events (before: the file was opened
    to write first, so closing it folded the WAL into the damaged file and deleted it, and it went to
    ``.unreadable-<time>``)."""
    live = EventSpool(tmp_path / "live", 1000, 2**24)
    live.add([xid(float(i)) for i in range(300)])
    live.events.spool._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    live.add([xid(float(i)) for i in range(300, 310)])
    state = tmp_path / "state"
    state.mkdir()
    for name in (SPOOL_FILE, SPOOL_FILE + "-wal"):  # copied while open: the WAL not folded in
        shutil.copy(tmp_path / "live" / name, state / name)
    live.close()
    whole = (state / SPOOL_FILE).read_bytes()
    (state / SPOOL_FILE).write_bytes(whole[:len(whole) // 2])
    kept = {name: (state / name).read_bytes() for name in (SPOOL_FILE, SPOOL_FILE + "-wal")}
    agent = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", state_dir=str(state)),
                  cpu_ratio=lambda: 0.1)
    assert agent.spool is not None and agent.pending_events == []
    (aside,) = state.glob(f"{SPOOL_FILE}.corrupt-*[0-9]")
    assert {SPOOL_FILE: aside.read_bytes(), SPOOL_FILE + "-wal": (state / f"{aside.name}-wal").read_bytes()} == kept
    named = [r.getMessage() for r in caplog.records if SPOOL_FILE in r.getMessage()]
    assert len(named) == 1 and "moved aside" in named[0] and aside.name in named[0], named
    agent._accept_events([xid(1.0)])
    agent.close()
    assert held_events(state) == 1


def test_a_spool_another_program_holds_locked_is_left_in_place_and_sent_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A spool holding two unsent events that cannot be opened now - another program holds it locked (a sqlite3
    shell; a disk full or failing answers the same way, an OperationalError) - is no damaged file: the agent runs
    without a spool and says why, the file stays where it is with its events, and the next start sends them
    (before: any such error moved the spool aside as unreadable and its events were never sent)."""
    import vigil.sources.collect.spool as spool_module

    monkeypatch.setattr(spool_module, "BUSY_TIMEOUT_S", 0.05, raising=False)
    state = tmp_path / "state"
    spool = EventSpool(state, 100, 2**20)
    spool.add([xid(1.0), xid(2.0)])
    spool.close()
    holder = sqlite3.connect(state / SPOOL_FILE, isolation_level=None, timeout=0.05)
    holder.execute("PRAGMA journal_mode=DELETE")
    holder.execute("BEGIN EXCLUSIVE")
    agent = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", state_dir=str(state)),
                  cpu_ratio=lambda: 0.1)
    assert agent.spool is None and "no events spool" in caplog.text and "moved aside" not in caplog.text
    agent.close()
    holder.execute("ROLLBACK")
    holder.close()
    assert sorted(p.name for p in state.iterdir() if ".corrupt-" in p.name) == []
    again = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", state_dir=str(state)),
                  cpu_ratio=lambda: 0.1)
    assert again.spool is not None and [e.ts for e in again.pending_events] == [1.0, 2.0]
    again.close()


def test_a_spool_another_program_died_writing_to_is_rolled_back_and_sent_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A spool holding two unsent events that another program (a sqlite3 shell in rollback-journal mode) died
    writing to has a hot journal, which only a writer may roll back: the agent opens it, SQLite rolls the dead
    transaction back, and the two events are sent, nothing moved aside (before: the read-only check failed with
    'attempt to write a readonly database' at every start, so the agent ran without a spool for good and the
    events were never sent)."""
    spool = EventSpool(tmp_path / "work", 100, 2**20)
    spool.add([xid(1.0), xid(2.0)])
    spool.close()
    state = tmp_path / "state"
    died_writing(spool.path, state)
    agent = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", state_dir=str(state)),
                  cpu_ratio=lambda: 0.1)
    assert agent.spool is not None and "no events spool" not in caplog.text, caplog.text
    assert [e.ts for e in agent.pending_events] == [1.0, 2.0]
    assert not list(state.glob("*.corrupt-*"))
    agent.close()


def test_the_spool_files_are_readable_by_the_agents_user_alone(tmp_path: Path) -> None:
    """Events name nodes and carry kernel and training log lines: the spool's database, its WAL and shared memory
    and its lock file are 0600 and a state directory the agent creates 0700 - also files an earlier agent left
    0644 (before: created with the umask's 0644, the directory 0755)."""
    state = tmp_path / "state"
    spool = EventSpool(state, 100, 2**20)
    spool.add([xid(1.0)])
    names = (SPOOL_FILE, SPOOL_FILE + "-wal", SPOOL_FILE + "-shm", "events-spool.lock")
    assert {n: oct((state / n).stat().st_mode & 0o777) for n in names} == dict.fromkeys(names, "0o600")
    assert oct(state.stat().st_mode & 0o777) == "0o700"
    spool.close()
    for name in names:
        if (state / name).exists():
            (state / name).chmod(0o644)
    spool = EventSpool(state, 100, 2**20)
    assert [e.ts for _, e in spool.load()] == [1.0]
    spool.add([xid(2.0)])
    assert {n: oct((state / n).stat().st_mode & 0o777) for n in names} == dict.fromkeys(names, "0o600")
    spool.close()


def _spool_failures(agent: Agent) -> float:
    return next(s.value for family in AgentExposition(agent).collect() for s in family.samples
                if s.name == "vigil_agent_events_spool_failures_total")


def test_a_full_disk_keeps_the_agent_sending_from_memory_warned_once_an_episode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The spool's file cannot grow (SQLite's 'database or disk is full', here by max_page_count): each read's
    events are queued in memory all the same and sent, in order; one warning for the episode (before: one a read)
    and the failed writes counted; once the file can grow the spool takes writes again, and says so."""
    state = tmp_path / "state"
    stored: list[float] = []

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            stored.extend(e["ts"] for e in json.loads(request.content))
        return httpx.Response(201, json={"stored": 1, "duplicates": 0})

    agent = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", server_token=TOKEN,
                                                    state_dir=str(state)), cpu_ratio=lambda: 0.1)
    assert agent._pusher is not None and agent.spool is not None
    agent._pusher._client = httpx.Client(transport=httpx.MockTransport(server))
    agent._accept_events([xid(0.0)])
    conn = agent.spool._conn
    conn.execute(f"PRAGMA max_page_count={conn.execute('PRAGMA page_count').fetchone()[0]}")
    with pytest.raises(sqlite3.OperationalError, match="full"):
        agent.spool.add([xid(float(i)) for i in range(1000, 1100)])
    for start in (1, 60, 119):
        agent._accept_events([xid(float(i)) for i in range(start, start + 59)])
    assert [e.ts for e in agent.pending_events] == [float(i) for i in range(178)] and held_events(state) == 1
    assert len([r for r in caplog.records if "spool" in r.getMessage() and "failed" in r.getMessage()]) == 1
    assert _spool_failures(agent) == 3
    _round(agent)
    assert stored == [float(i) for i in range(178)] and held_events(state) == 0 and not agent.pending_events
    conn.execute("PRAGMA max_page_count=1073741823")
    agent._accept_events([xid(200.0)])
    assert held_events(state) == 1 and "takes writes again" in caplog.text
    agent.close()


def test_answered_events_a_failed_removal_left_in_the_spool_are_removed_with_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server took two events but removing them from the spool failed (a full disk): they are removed with the
    next events answered, not left to be sent again after every restart and counted against the spool's bounds
    (before: they stayed until pushed out as the oldest, counted then as dropped unsent)."""
    state = tmp_path / "state"
    agent = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", server_token=TOKEN,
                                                    state_dir=str(state)), cpu_ratio=lambda: 0.1)
    assert agent._pusher is not None and agent.spool is not None
    agent._pusher._client = httpx.Client(transport=httpx.MockTransport(
        lambda r: httpx.Response(201, json={"stored": 1, "duplicates": 0})))
    remove, failing = agent.spool.remove, [True]

    def flaky(ids: Any) -> None:
        if failing.pop() if failing else False:
            raise sqlite3.OperationalError("database or disk is full")
        remove(ids)

    monkeypatch.setattr(agent.spool, "remove", flaky)
    agent._accept_events([xid(1.0), xid(2.0)])
    _round(agent)
    assert held_events(state) == 2 and not agent.pending_events
    agent._accept_events([xid(3.0)])
    _round(agent)
    assert held_events(state) == 0 and len(agent.spool) == 0 and agent.events_spool_dropped == 0
    agent.close()


def test_rows_of_no_event_in_the_spool_are_dropped_and_the_agent_starts_with_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A spool whose rows include ones that are no event's JSON text - a number, JSON nested deeper than the parser
    goes, a truncated text - is read without them: the agent starts and sends the events around them (before: the
    parser's RecursionError left the agent's constructor, so it could not start at all while the file was there)."""
    state = tmp_path / "state"
    spool = EventSpool(state, 100, 2**20)
    spool.add([xid(1.0)])
    spool.close()
    conn = sqlite3.connect(state / SPOOL_FILE, isolation_level=None)
    for body in (42, "[" * 100_000 + "]" * 100_000, '{"ts": 2.0, "ent'):
        conn.execute("INSERT INTO events (body) VALUES (?)", (body,))
    conn.close()
    spool = EventSpool(state, 100, 2**20)
    spool.add([xid(3.0)])
    spool.close()
    agent = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", state_dir=str(state)),
                  cpu_ratio=lambda: 0.1)
    assert agent.spool is not None and [e.ts for e in agent.pending_events] == [1.0, 3.0]
    assert agent.spool.unreadable == 3 and held_events(state) == 2 and "3 row(s) that are no event" in caplog.text
    agent.close()
