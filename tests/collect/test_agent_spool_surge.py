"""Two agents on one state directory - a DaemonSet's surge rollout, a systemd restart overlapping the old process:
the second spools to a file of its own instead of running without a spool, and whichever agent finds a spool file
no agent holds takes it over, so no event is lost when either one goes first. Real agent processes, killed with
SIGKILL, against the server's real app on real HTTP."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

import pytest

from tests.collect.conftest import TOKEN, Switch, agent_process, xid_line
from tests.conftest import wait_for
from tests.serve.conftest import serve_in_thread
from vigil.sources.collect.spool import SPOOL_FILE


def held_by_file(state: Path) -> dict[str, int]:
    """The events each spool file of the directory holds, read as another process reads them."""
    held: dict[str, int] = {}
    for path in sorted(state.glob("events-spool*.sqlite")):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            held[path.name] = int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
        except sqlite3.Error:
            held[path.name] = -1
        finally:
            conn.close()
    return held


@pytest.mark.slow
def test_a_second_agent_on_the_state_directory_spools_beside_the_first_and_takes_over_what_either_left(
    tmp_path: Path,
) -> None:
    """With the server away, agent A holds the directory's spool and reads 20 Xid lines; agent B, started beside it,
    reads 20 others and spools them to a file of its own (before: no spool at all). A is killed (SIGKILL) and the
    server comes back: B takes over A's spool and all 40 are stored while B runs (before: A's 20 waited for a
    restart). The server goes away again, B reads 10 more and is killed too; agent C starts, takes the directory's
    spool and B's file: all 50 stored, each once, and only C's spool file is left."""
    from vigil.config import Settings
    from vigil.faces.api.app import create_app
    from vigil.store.sql import Store

    settings = Settings(home=tmp_path / "home", api_token=TOKEN)
    store = Store(settings.database_url())
    switch = Switch(create_app(store, settings=settings))
    state, log = tmp_path / "state", tmp_path / "agent.log"
    kmsg_a, kmsg_b, kmsg_c = tmp_path / "a.log", tmp_path / "b.log", tmp_path / "c.log"
    kmsg_a.write_text("".join(xid_line(i) for i in range(20)))
    kmsg_b.write_text("".join(xid_line(i) for i in range(20, 40)))
    kmsg_c.write_text("")

    def stored() -> list[str]:
        return [e.message for e in store.events(kind="xid", limit=1000)]

    with serve_in_thread(switch) as url:
        switch.mode = "down"
        with agent_process(url, kmsg_a, state, log) as agent_a:
            wait_for(lambda: held_by_file(state).get(SPOOL_FILE) == 20, 60, "A's 20 events spooled")
            with agent_process(url, kmsg_b, state, log) as agent_b:
                wait_for(lambda: sorted(held_by_file(state).values()) == [20, 20], 60,
                         "B's 20 events spooled to a file of its own")
                agent_a.send_signal(signal.SIGKILL)
                agent_a.wait(timeout=30)
                switch.mode = "up"
                wait_for(lambda: len(stored()) == 40, 60, "A's and B's events stored while B runs")
                assert SPOOL_FILE not in held_by_file(state)  # A's file taken over and removed
                switch.mode = "down"
                with kmsg_b.open("a") as f:
                    f.write("".join(xid_line(i) for i in range(40, 50)))
                wait_for(lambda: list(held_by_file(state).values()) == [10], 60, "B's 10 new events spooled")
                agent_b.send_signal(signal.SIGKILL)
                agent_b.wait(timeout=30)
        switch.mode = "up"
        with agent_process(url, kmsg_c, state, log) as agent_c:
            wait_for(lambda: len(stored()) == 50 and held_by_file(state) == {SPOOL_FILE: 0}, 60,
                     "C sends what B left")
            agent_c.send_signal(signal.SIGTERM)
            assert agent_c.wait(timeout=30) == 0
    messages = stored()
    assert all(sum(m.endswith(f"Graphics Exception {i}") for m in messages) == 1 for i in range(50)), messages
    text = log.read_text()
    assert "no events spool" not in text and "took over the spool" in text, text[-3000:]
    assert sorted(p.name for p in state.glob("events-spool*") if not p.name.startswith(SPOOL_FILE)) == [
        "events-spool.lock"]
    store.close()


def test_an_agent_takes_over_the_events_and_samples_pushes_of_a_spool_let_go_beside_it(tmp_path: Path) -> None:
    """A spool holding two events and two samples pushes is held while an agent starts on its directory: the agent
    spools to its own file and leaves the held one alone. Once the holder lets go, the agent's next look queues
    the events first and puts the pushes in its backlog in the order made, writes them to its own file, and removes
    the one it took over."""
    import httpx

    from tests.collect.conftest import CountingSource, fast_settings, xid
    from vigil.sources.collect.agent import Agent
    from vigil.sources.collect.spool import EventSpool

    state = tmp_path / "state"
    first = EventSpool(state, 100, 2**20)
    first.add([xid(1.0), xid(2.0)])
    first.samples(24, 2**20).add([('{"node":"n01","samples":[]}', "k2", 2e9 - 10.0),
                                  ('{"node":"n01","samples":[]}', "k1", 2e9 - 20.0)])
    agent = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", state_dir=str(state)),
                  cpu_ratio=lambda: 0.1)
    assert agent.spool is not None and agent._pusher is not None and agent.spool.path != first.path
    agent._pusher._wall = lambda: 2e9
    agent._pusher._client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    agent._accept_events([xid(3.0)])
    agent.take_over()
    assert [e.ts for e in agent.pending_events] == [3.0]  # the held file is another agent's
    first.close()
    agent.take_over()
    assert [e.ts for e in agent.pending_events] == [1.0, 2.0, 3.0]
    assert [p.key for p in agent._pusher.backlog] == ["k1", "k2"] and len(agent._pusher._spooled) == 2
    assert held_by_file(state) == {agent.spool.path.name: 3}
    agent.close()
    again = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", state_dir=str(state)),
                  cpu_ratio=lambda: 0.1)
    assert again.spool is not None and again.spool.path.name == SPOOL_FILE and again._pusher is not None
    assert sorted(e.ts for e in again.pending_events) == [1.0, 2.0, 3.0]
    assert sorted(p.key for p in again._pusher.backlog) == ["k1", "k2"]
    again.close()
    assert held_by_file(state) == {SPOOL_FILE: 3}


def test_a_spool_file_taken_over_by_another_agent_meanwhile_leaves_no_lock_file_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two agents look for left spool files at once: the other one takes the file over and removes it (with its
    lock file) between this one's listing and its lock. Taking the lock makes the lock file again; it is removed,
    not left in the directory for good (one .lock file a race before)."""
    from vigil.sources.collect import spool as spool_module

    state = tmp_path / "state"
    live = spool_module.EventSpool(state, 100, 2**20)
    left = state / "events-spool-0badf00d.sqlite"
    sqlite3.connect(left).close()
    real_take_lock = spool_module._take_lock

    def raced(path: Path) -> object:
        if path.name == "events-spool-0badf00d.lock":  # the other agent's discard, just before this lock
            left.unlink()
            path.unlink(missing_ok=True)
        return real_take_lock(path)

    monkeypatch.setattr(spool_module, "_take_lock", raced)
    assert list(live.orphans()) == []
    assert sorted(p.name for p in state.glob("events-spool*.lock")) == ["events-spool.lock"]
    live.close()


def left_spool(state: Path, how: str) -> bytes:
    """The bytes of a spool file a dead agent left in ``state`` (events-spool-0badf00d.sqlite, with its lock file)
    that no SQLite reads: a real spool of 300 events cut to half its length (``cut``), or no database at all."""
    from tests.collect.conftest import xid
    from vigil.sources.collect.spool import EventSpool

    made = EventSpool(state.parent / f"made-{how}", 1000, 2**24)
    made.add([xid(float(i)) for i in range(300)])
    made.close()
    whole = (made.path).read_bytes()
    data = whole[:len(whole) // 2] if how == "cut" else bytes(range(256)) * 32
    state.mkdir(parents=True, exist_ok=True)
    (state / "events-spool-0badf00d.sqlite").write_bytes(data)
    (state / "events-spool-0badf00d.lock").touch()
    return data


@pytest.mark.slow
def test_an_agent_moves_a_corrupt_spool_file_another_agent_left_aside_once_and_goes_on(tmp_path: Path) -> None:
    """A dead agent's spool file cut short lies in the state directory. The agent started on it moves the file aside
    (``<name>.corrupt-<time>``, its bytes as they were), says so in one log line naming it, removes its lock file,
    and sends its own events round after round (before: the file was tried again every round, for good)."""
    from vigil.config import Settings
    from vigil.faces.api.app import create_app
    from vigil.store.sql import Store

    settings = Settings(home=tmp_path / "home", api_token=TOKEN)
    store = Store(settings.database_url())
    switch = Switch(create_app(store, settings=settings))
    state, log, kmsg = tmp_path / "state", tmp_path / "agent.log", tmp_path / "kern.log"
    data = left_spool(state, "cut")
    kmsg.write_text("")

    def stored() -> int:
        return len(store.events(kind="xid", limit=1000))

    with serve_in_thread(switch) as url, agent_process(url, kmsg, state, log) as agent:
        wait_for(lambda: list(state.glob("events-spool-0badf00d.sqlite.corrupt-*[0-9]")), 60,
                 "the left file moved aside")
        for i in range(3):  # a round each at least: the agent goes on
            with kmsg.open("a") as f:
                f.write(xid_line(i))
            wait_for(lambda: stored() == i + 1, 60, f"Xid line {i} stored")  # noqa: B023 - called at once
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0
    (aside,) = state.glob("events-spool-0badf00d.sqlite.corrupt-*[0-9]")
    assert aside.read_bytes() == data
    named = [line for line in log.read_text().splitlines() if "events-spool-0badf00d" in line]
    assert len(named) == 1 and "moved aside" in named[0] and aside.name in named[0], named
    assert sorted(p.name for p in state.glob("events-spool*") if ".corrupt-" not in p.name
                  and not p.name.startswith(SPOOL_FILE)) == ["events-spool.lock"]
    store.close()


@pytest.mark.parametrize("how", ["cut", "garbage"])
def test_a_corrupt_spool_file_left_beside_is_moved_aside_once_with_one_warning_and_the_spool_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str,
) -> None:
    """Looked at three times, a left spool file no SQLite reads - cut short, or no database at all - is moved aside
    at the first (its bytes kept, its -wal beside it moved with it), warned about once, and not looked at again; the
    agent's own spool takes events all along."""
    from tests.collect.conftest import CountingSource, fast_settings, held_events, xid
    from vigil.sources.collect.agent import Agent

    state = tmp_path / "state"
    data = left_spool(state, how)
    (state / "events-spool-0badf00d.sqlite-wal").write_bytes(b"wal frames")
    agent = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", state_dir=str(state)),
                  cpu_ratio=lambda: 0.1)
    for ts in (1.0, 2.0, 3.0):
        agent.take_over()
        agent._accept_events([xid(ts)])
    (aside,) = state.glob("events-spool-0badf00d.sqlite.corrupt-*[0-9]")
    assert aside.read_bytes() == data and (state / f"{aside.name}-wal").read_bytes() == b"wal frames"
    assert not (state / "events-spool-0badf00d.sqlite").exists() and not (state / "events-spool-0badf00d.lock").exists()
    named = [r.getMessage() for r in caplog.records if "events-spool-0badf00d" in r.getMessage()]
    assert len(named) == 1 and "moved aside" in named[0], named
    assert [e.ts for e in agent.pending_events] == [1.0, 2.0, 3.0] and held_events(state) == 3
    agent.close()


def test_a_left_spool_file_locked_by_another_program_is_not_moved_aside_and_is_taken_over_once_free(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A left spool file another program holds locked (a sqlite3 shell's exclusive lock) cannot be read now, which
    says nothing of what it holds: it is left where it is, warned about once, and taken over once the lock is gone."""
    from tests.collect.conftest import xid
    from vigil.sources.collect.spool import EventSpool

    state = tmp_path / "state"
    left = EventSpool(tmp_path / "left", 100, 2**20)
    left.add([xid(1.0)])
    left.close()
    state.mkdir()
    left.path.rename(state / "events-spool-0badf00d.sqlite")
    live = EventSpool(state, 100, 2**20)
    holder = sqlite3.connect(state / "events-spool-0badf00d.sqlite", isolation_level=None)
    holder.execute("PRAGMA journal_mode=DELETE")
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    assert list(live.orphans()) == [] and list(live.orphans()) == []
    assert (state / "events-spool-0badf00d.sqlite").exists() and not list(state.glob("*.corrupt-*"))
    assert len([r for r in caplog.records if "events-spool-0badf00d" in r.getMessage()]) == 1
    holder.execute("COMMIT")
    holder.close()
    (orphan,) = live.orphans()
    assert len(orphan.rows("events")) == 1
    orphan.discard()
    live.close()


def test_a_left_spool_file_whose_rows_cannot_be_read_is_warned_about_once_until_it_changes_or_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A left spool file that opens but whose rows cannot be read now (a disk failing: SQLite's 'disk I/O error')
    is left where it is and warned about once over three rounds (before: once a round); warned again once it has
    changed, not at all once it reads and is taken over."""
    from tests.collect.conftest import CountingSource, fast_settings, xid
    from vigil.sources.collect.agent import Agent
    from vigil.sources.collect.spool import EventSpool, OrphanSpool

    state = tmp_path / "state"
    left = EventSpool(tmp_path / "left", 100, 2**20)
    left.add([xid(1.0)])
    left.close()
    state.mkdir()
    orphan_path = state / "events-spool-0badf00d.sqlite"
    left.path.rename(orphan_path)
    readable_rows = OrphanSpool.rows

    def failing_disk(self: OrphanSpool, table: str, columns: tuple[str, ...] = ()) -> list[tuple[object, ...]]:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(OrphanSpool, "rows", failing_disk)
    agent = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", state_dir=str(state)),
                  cpu_ratio=lambda: 0.1)

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if orphan_path.name in r.getMessage()]

    for _ in range(3):
        agent.take_over()
    assert len(warnings()) == 1 and "disk I/O error" in warnings()[0], warnings()
    changed = sqlite3.connect(orphan_path, isolation_level=None)
    changed.execute("INSERT INTO events (body) VALUES (?)", (xid(2.0).model_dump_json(),))
    changed.close()
    for _ in range(3):
        agent.take_over()
    assert len(warnings()) == 2 and orphan_path.exists() and agent.pending_events == []
    monkeypatch.setattr(OrphanSpool, "rows", readable_rows)
    agent.take_over()
    assert [e.ts for e in agent.pending_events] == [1.0, 2.0] and not orphan_path.exists()
    assert len(warnings()) == 3 and "took over" in warnings()[2]
    agent.close()


def test_a_left_spool_path_that_cannot_be_opened_is_warned_about_once_until_it_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A left spool path SQLite cannot open at all (here a directory: an I/O error, no damaged database) is never
    moved aside, and is warned about once over three looks; once it has changed, once more (before: once for good,
    however it changed)."""
    from vigil.sources.collect.spool import EventSpool

    state = tmp_path / "state"
    live = EventSpool(state, 100, 2**20)
    unopenable = state / "events-spool-0badf00d.sqlite"
    unopenable.mkdir()

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if unopenable.name in r.getMessage()]

    for _ in range(3):
        assert list(live.orphans()) == []
    assert len(warnings()) == 1 and "tried again later" in warnings()[0], warnings()
    (unopenable / "written").touch()  # the directory's mtime moves
    for _ in range(3):
        assert list(live.orphans()) == []
    assert len(warnings()) == 2 and unopenable.is_dir() and not list(state.glob("*.corrupt-*"))
    live.close()


def test_a_left_spool_file_another_program_died_writing_to_is_rolled_back_and_taken_over(tmp_path: Path) -> None:
    """A left spool file with a hot journal (a program died writing to it in rollback-journal mode) is no damaged
    file: the agent rolls the dead transaction back, takes its event over and removes it, nothing moved aside
    (before: its read-only check failed at every look, 'attempt to write a readonly database', for good)."""
    from tests.collect.conftest import CountingSource, died_writing, fast_settings, xid
    from vigil.sources.collect.agent import Agent
    from vigil.sources.collect.spool import EventSpool

    left = EventSpool(tmp_path / "left", 100, 2**20)
    left.add([xid(1.0)])
    left.close()
    state = tmp_path / "state"
    died_writing(left.path, state, "events-spool-0badf00d.sqlite")
    agent = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", state_dir=str(state)),
                  cpu_ratio=lambda: 0.1)
    assert [e.ts for e in agent.pending_events] == [1.0]
    assert not list(state.glob("events-spool-0badf00d*")) and not list(state.glob("*.corrupt-*"))
    agent.close()
