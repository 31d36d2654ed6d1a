"""A kernel line logged twice is two events; the same line read twice is one. The server keys a pushed event by all
its fields, so each kernel event says where it was read - the kernel's sequence number (/dev/kmsg), the journal's
cursor, the file and byte offset - and two equal Xid lines stamped in the same second (a dmesg -T or syslog capture)
are both stored, while an agent restarted and reading the same lines again stores none twice."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.collect.conftest import TOKEN, Switch, agent_process, held_events
from tests.conftest import wait_for
from tests.serve.conftest import serve_in_thread
from vigil.faces.api.push_keys import event_key
from vigil.model import Event
from vigil.sources.collect.kmsg import JOURNAL_CURSOR_ATTR, KMSG_SEQ_ATTR, JournalReader, KernelLogSource

# Xid 13 twice from two faults in one second, in syslog's shape (/var/log/kern.log stamps seconds), then Xid 31
REPEATED = ("Dec  7 14:00:01 n01 kernel: NVRM: Xid (PCI:0000:18:00): 13, pid=1234, name=train, Graphics Exception: "
            "ESR 0x404490=0x80000002\n")
OTHER = "Dec  7 14:00:02 n01 kernel: NVRM: Xid (PCI:0000:18:00): 31, pid=1234, name=train, MMU Fault\n"


def test_two_equal_xid_lines_in_one_second_are_both_stored_and_a_restart_reads_none_twice(tmp_path: Path) -> None:
    """A real agent reads a kernel log holding the same Xid 13 line twice in one second and a third line, and pushes
    them to the server's real app: 3 events stored (2 before: the repeat was taken for a retry of the first). It is
    stopped and started again on the same file, which it reads again from the start: still 3 stored."""
    from vigil.config import Settings
    from vigil.faces.api.app import create_app
    from vigil.store.sql import Store

    settings = Settings(home=tmp_path / "home", api_token=TOKEN)
    store = Store(settings.database_url())
    switch = Switch(create_app(store, settings=settings))
    kmsg, state = tmp_path / "kern.log", tmp_path / "state"
    kmsg.write_text(REPEATED + REPEATED + OTHER)

    def stored() -> list[int]:
        return sorted(int(e.attrs["xid"]) for e in store.events(kind="xid", limit=100))

    with serve_in_thread(switch) as url:
        for start in range(2):
            with agent_process(url, kmsg, state, tmp_path / "agent.log") as agent:
                posts = len(switch.events_posts)
                # the read's events answered: taken off the spool after a POST of this process
                wait_for(lambda: len(switch.events_posts) > posts and held_events(state) == 0, 60,  # noqa: B023
                         f"start {start}: the kernel log's events pushed")
                agent.send_signal(signal.SIGTERM)
                assert agent.wait(timeout=30) == 0
            assert stored() == [13, 13, 31], (tmp_path / "agent.log").read_text()[-3000:]
    store.close()


def test_kmsg_records_and_journal_entries_are_told_apart_by_the_kernels_position() -> None:
    """Two /dev/kmsg records with the same text and microsecond differ in their sequence numbers, two journal
    entries with the same text and time in their cursors: two keys each. The same record or entry read again (a
    restart reads the ring buffer's or the journal's last hour again) gives the same key."""
    line = "NVRM: Xid (PCI:0000:18:00): 13, pid=1234, name=train, Graphics Exception"
    records = [f"3,{seq},5000000,-;{line}" for seq in (811, 812, 811)]
    kernel = KernelLogSource(lambda: records, node="n01", boot_time=1_700_000_000.0)
    events = kernel.collect(0.0).events
    assert [e.attrs[KMSG_SEQ_ATTR] for e in events] == [811, 812, 811]
    keys = [event_key(e) for e in events]
    assert keys[0] != keys[1] and keys[0] == keys[2]

    journal = JournalReader()
    entries = [{"__REALTIME_TIMESTAMP": "1765116001000000", "__CURSOR": cursor, "MESSAGE": line}
               for cursor in ("s=ab;i=10", "s=ab;i=11", "s=ab;i=10")]
    output = "\n".join(json.dumps(e) for e in entries)
    kernel = KernelLogSource(lambda: journal.parse(output), node="n01", positions=journal.positions)
    events = kernel.collect(0.0).events
    assert [e.attrs[JOURNAL_CURSOR_ATTR] for e in events] == ["s=ab;i=10", "s=ab;i=11", "s=ab;i=10"]
    keys = [event_key(e) for e in events]
    assert keys[0] != keys[1] and keys[0] == keys[2]


def test_a_record_read_again_after_a_restart_keeps_its_time_though_the_kernels_boot_time_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel's boot time (/proc/stat's btime) is the wall clock less the time since boot and moves a second as
    NTP adjusts the clock: an agent restarted then stamped the same /dev/kmsg record a second later and the server
    stored it twice. Agents of one boot on a state directory stamp records with the boot time the first one wrote
    there: the same key (different keys before). A new boot (another boot id) takes the kernel's figure again."""
    import psutil

    from tests.collect.conftest import fast_settings
    from vigil.sources.collect.agent import build_sources

    record = "3,811,5000000,-;NVRM: Xid (PCI:0000:18:00): 13, pid=1234, name=train, Graphics Exception"
    kmsg = tmp_path / "kmsg.log"
    kmsg.write_text(record + "\n")
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("4f1c\n")
    monkeypatch.setattr("vigil.sources.collect.kmsg.BOOT_ID", boot_id)
    settings = fast_settings(server_url="http://vigil.test", state_dir=str(tmp_path / "state"), kmsg_file=str(kmsg))

    def read_with_boot_time(btime: float) -> list[Event]:
        monkeypatch.setattr(psutil, "boot_time", lambda: btime)
        kernel = next(s for s in build_sources(settings) if isinstance(s, KernelLogSource))
        events = kernel.collect(0.0).events
        kernel.close()
        return events

    first, restarted = read_with_boot_time(1_765_000_000.0), read_with_boot_time(1_765_000_001.0)
    assert first[0].ts == restarted[0].ts == 1_765_000_005.0
    assert event_key(first[0]) == event_key(restarted[0])
    boot_id.write_text("77aa\n")
    assert read_with_boot_time(1_765_100_000.0)[0].ts == 1_765_100_005.0


def test_an_upgraded_agent_reading_the_last_hour_again_stores_no_kernel_event_twice(tmp_path: Path) -> None:
    """An agent before the read positions pushed a kernel log's events without them; the upgraded agent reads the
    same lines again (its first look takes the last hour) and its events say where each was read. The server takes
    each for the one stored before: nothing stored twice (3 more before), while a line new since is stored."""
    from fastapi.testclient import TestClient

    from vigil.config import Settings
    from vigil.faces.api.app import create_app
    from vigil.faces.api.push_keys import KERNEL_POSITION_ATTRS
    from vigil.store.sql import Store

    kmsg = tmp_path / "kern.log"
    kmsg.write_text(REPEATED + OTHER)
    read = KernelLogSource.from_file(kmsg, node="n01").collect(0.0).events
    old = [e.model_copy(update={"attrs": {k: v for k, v in e.attrs.items() if k not in KERNEL_POSITION_ATTRS}})
           for e in read]
    assert len(read) == 2 and all(e.attrs != o.attrs for e, o in zip(read, old, strict=True))
    kmsg.write_text(REPEATED + OTHER + REPEATED.replace("14:00:01", "14:05:00"))
    upgraded = KernelLogSource.from_file(kmsg, node="n01").collect(0.0).events

    settings = Settings(home=tmp_path / "home", api_token=TOKEN)
    store = Store(settings.database_url())
    with TestClient(create_app(store, settings=settings)) as client:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        first = client.post("/api/v1/events", headers=auth, json=[e.model_dump(mode="json") for e in old])
        assert first.status_code == 201 and first.json()["duplicates"] == 0
        again = client.post("/api/v1/events", headers=auth, json=[e.model_dump(mode="json") for e in upgraded])
        assert again.status_code == 201 and again.json()["duplicates"] == 2, again.json()
    stored = store.events(kind="xid", limit=100)
    assert sorted(int(e.attrs["xid"]) for e in stored) == [13, 13, 31]
    store.close()


def test_a_boot_time_file_that_cannot_be_written_leaves_nothing_behind(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A state directory whose disk is full takes the first write and fails the rename: the kernel's figure is used
    and no boot-time.<pid> file is left (one was left per start before, on every node of a full disk)."""
    import errno
    import os

    import psutil

    from vigil.sources.collect.kmsg import BOOT_TIME_FILE, stable_boot_time

    boot_id = tmp_path / "boot_id"
    boot_id.write_text("4f1c\n")
    monkeypatch.setattr(psutil, "boot_time", lambda: 1_765_000_000.0)

    def full(*_args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    state = tmp_path / "state"
    assert stable_boot_time(state, boot_id) == 1_765_000_000.0
    assert [p.name for p in state.iterdir()] == []
    monkeypatch.undo()
    monkeypatch.setattr(psutil, "boot_time", lambda: 1_765_000_000.0)
    assert stable_boot_time(state, boot_id) == 1_765_000_000.0
    assert [p.name for p in state.iterdir()] == [BOOT_TIME_FILE]
