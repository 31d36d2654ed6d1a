"""What makes a pushed event the same event when its sender sends it again, so the store keeps it once.

Node agents and ``vigil launch`` deliver at least once: a push whose answer was lost (a timeout on the way back)
is sent again with the same events. Each event a push may repeat gets a key that a retry reproduces and that no
two real events share; the store writes an event whose key it holds already no second time (the events table's
unique ``push_key``, ``vigil.store.sql.Store.add_events``) and the route counts it as a duplicate. The step
telemetry of a launch report and an agent's samples push (which the agent names) are keyed the same way in the
metric pushes (``Store.add_samples``), and Alertmanager, which sends a firing alert again every
``repeat_interval`` and a notification again when its webhook failed, has its alerts keyed by what it says an
alert is.

The trade-off: a key is all a retry repeats, so two real events that share it are stored as one. For an event
pushed on its own that is every field, the time included - the same line written twice within one tick of its
sender's clock, by a sender that does not say where each was read, is stored once. A retry cannot be told from
such a repeat, and counting a retried push twice is the worse error.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from vigil.faces.api.alertmanager import Alert
from vigil.model import Event, Sample, StepTelemetry
from vigil.sources.collect.kmsg import JOURNAL_CURSOR_ATTR, KMSG_SEQ_ATTR
from vigil.sources.collect.rank_files import LOG_FILE_ATTR, LOG_OFFSET_ATTR

# Where an agent says it read a kernel line (``vigil.sources.collect.kmsg``); agents before these said nothing.
KERNEL_POSITION_ATTRS = (KMSG_SEQ_ATTR, JOURNAL_CURSOR_ATTR, LOG_FILE_ATTR, LOG_OFFSET_ATTR)


def event_key(event: Event) -> str | None:
    """What an event pushed on its own (``POST /api/v1/events``, a launch report) is: all of it - the entity, kind,
    source, time, level, text and attributes. A push sent again repeats every field; two events that differ in
    one are two, so a line logged again at another time is kept. Two events equal in every field are read as one
    sent twice, and a sender that can see two such events tells them apart in their attributes, as the agent and
    the launcher do for a log line (the file and byte offset it was read at). None for a ``rank_log`` line that
    does not say where it was read: two equal lines of one look share everything else, so such lines are stored
    as they come."""
    if event.kind == "rank_log" and _read_at(event) is None:
        return None
    return _digest(["event", event.entity, event.kind, event.source, event.ts, int(event.level), event.message,
                    event.attrs])


def unplaced_event_key(event: Event) -> str | None:
    """The key an agent pushed event had before agents said where its kernel line was read: ``event_key`` of the
    event without ``KERNEL_POSITION_ATTRS``; None for an event that says nothing of where it was read, or a
    ``rank_log`` line. An upgraded agent reads the ring buffer's, the journal's or the file's last hour again, and
    its events now say where each line stood: one whose unplaced key the store holds was stored by the agent before
    the upgrade and is a duplicate, not a second Xid (``POST /api/v1/events``). Two equal lines in one second the old
    agent stored as one stay one for the lines it had read."""
    if event.kind == "rank_log":
        return None
    attrs = {k: v for k, v in event.attrs.items() if k not in KERNEL_POSITION_ATTRS}
    if len(attrs) == len(event.attrs):
        return None
    return _digest(["event", event.entity, event.kind, event.source, event.ts, int(event.level), event.message,
                    attrs])


def rank_log_key(node: str, event: Event) -> str | None:
    """What one rank-log line of a node's push (``POST /api/v1/rank-logs``) is: the pushing node, the rank, the
    file and byte offset the agent read the line at, the look's time and the line
    (``vigil.sources.collect.rank_files``). A push sent again repeats all of them; two lines never share them (two
    equal lines of one look stand at two offsets, and a file truncated and written again is read at a later
    look). None for an event that does not say where its line was read (an older agent's): such events are stored
    as they come."""
    read_at = _read_at(event)
    if read_at is None:
        return None
    return _digest([node, event.entity, *read_at, event.ts, event.message])


def launch_steps_key(job: str, steps: Sequence[StepTelemetry]) -> str | None:
    """What the step telemetry of a launch report is: the job and the time of its newest look. The launcher looks
    at its job once at a time and puts each look in one report, which it sends again as it was until the server
    answers (``vigil.run.report``), so a report sent again repeats that time and two reports of one job never share
    it. The stored push keeps the time (``metric_pushes.ts``, its newest sample's), which let revision 0007 key the
    launch pushes stored before it; the two must agree. The key is kept for ``push_key_window_s`` after it was
    stored (``metric_push_keys``), however soon the engine prunes the push itself (about five minutes,
    ``vigil.run.engine``): a report sent again after the window is stored again. None for a report without
    telemetry."""
    if not steps:
        return None
    return _digest(["launch_steps", job, max(look.ts for look in steps)])


def samples_key(node: str, idempotency_key: str) -> str:
    """What an agent's samples push (``POST /api/v1/samples``) is: the pushing node and the key the agent gave it
    (its ``Idempotency-Key`` header, new for each push and the same when the push is sent again,
    ``vigil.sources.collect.agent.EventPusher``). The node is part of it, so one node's key never stands for
    another's push. Kept for ``push_key_window_s``, as ``launch_steps_key``."""
    return _digest(["samples", node, idempotency_key])


def samples_digest(samples: Sequence[Sample]) -> str:
    """What an agent's samples push holds, stored with its key: the same push sent again holds the same samples,
    and a key sent with other samples (a sender that reuses keys) is refused, not taken for a retry."""
    return _digest(["samples", [s.model_dump(mode="json") for s in samples]])


def alert_key(alert: Alert, common_labels: Mapping[str, str] | None = None) -> str:
    """What one alert of an Alertmanager notification is: the alert (its ``fingerprint``, the hash of its labels
    that Alertmanager gives; where a payload lacks it, its labels under the notification's ``commonLabels``, as its
    stored event holds them), when it started (``startsAt``, in UTC) and its status. A notification sent again -
    every ``repeat_interval`` while the alert fires, or after the webhook did not answer - repeats all three, so it
    stores nothing new; the alert's resolution is one event; an alert that fires again after it resolved starts
    again (a new ``startsAt``) and is a new event. The rest may change between two notifications of one alert and
    is left out: ``endsAt`` of a firing alert, annotations re-evaluated by Prometheus (a value in the summary), the
    group key and receiver of one alert routed to two receivers. Labels and start are those store revision 0008
    rebuilt the key of an alert stored before the key from (its event's labels and time): a sender that puts a
    label in ``commonLabels`` only, or gives ``startsAt`` in another offset, keys an alert as 0008 keyed it."""
    identity: str | dict[str, str] = alert.fingerprint or {**(common_labels or {}), **alert.labels}
    started = datetime.fromtimestamp(alert.starts_at.timestamp(), UTC)
    return _digest(["alert", identity, started.isoformat(), alert.status])


def _read_at(event: Event) -> tuple[str, int] | None:
    """The file and byte offset a log line's event says its line was read at, or None."""
    where, offset = event.attrs.get(LOG_FILE_ATTR), event.attrs.get(LOG_OFFSET_ATTR)
    if not isinstance(where, str) or not isinstance(offset, int) or isinstance(offset, bool):
        return None
    return where, offset


def _digest(identity: list[Any]) -> str:
    # sort_keys: attributes in another order are the same attributes
    text = json.dumps(identity, ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
