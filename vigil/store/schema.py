"""The relational schema (SQLAlchemy Core). Changes go through a new alembic revision in migrations/."""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Boolean, Column, Float, Index, Integer, MetaData, String, Table, Text

metadata = MetaData()

events = Table(
    "events", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ts", Float, nullable=False),
    Column("entity", String(300), nullable=False),
    Column("kind", String(100), nullable=False),
    Column("source", String(100), nullable=False),
    Column("level", Integer, nullable=False),
    Column("message", Text, nullable=False),
    Column("attrs", JSON, nullable=False),
    # What a pushed event is (a digest of who pushed it and where its line was read), for the events a push may
    # send again; NULL for the others. Unique: a retried push stores its events once.
    Column("push_key", String(64), nullable=True),
    # The transaction that wrote the row (PostgreSQL's pg_current_xact_id(), the server default revision 0011 sets;
    # 0 on SQLite and for the rows stored before 0011): consumers read in (xid, id) order, see vigil.store.sql.
    Column("xid", BigInteger, nullable=False, server_default="0"),
    Index("ix_events_ts", "ts"),
    Index("ix_events_entity_ts", "entity", "ts"),
    Index("ux_events_push_key", "push_key", unique=True),
    Index("ix_events_xid_id", "xid", "id"),
)

logs = Table(
    "logs", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ts", Float),
    Column("entity", String(300), nullable=False),
    Column("source", String(100), nullable=False),
    Column("line", Text, nullable=False),
    Column("lineno", Integer),
    Index("ix_logs_entity_ts", "entity", "ts"),
)

anomalies = Table(
    "anomalies", metadata,
    Column("id", String(64), primary_key=True),
    Column("entity", String(300), nullable=False),
    Column("start", Float, nullable=False),
    Column("end", Float, nullable=False),
    Column("detector", String(100), nullable=False),
    Column("fault_type", String(100), nullable=False),
    Column("level", Integer, nullable=False),
    Column("body", JSON, nullable=False),
    Index("ix_anomalies_entity_start", "entity", "start"),
)

incidents = Table(
    "incidents", metadata,
    Column("id", String(64), primary_key=True),
    Column("start", Float, nullable=False),
    Column("end", Float, nullable=False),
    Column("level", Integer, nullable=False),
    Column("status", String(20), nullable=False),
    Column("scope", String(300), nullable=False),
    Column("title", Text, nullable=False),
    Column("body", JSON, nullable=False),
    Index("ix_incidents_start", "start"),
)

actions = Table(
    "actions", metadata,
    Column("id", String(64), primary_key=True),
    Column("ts", Float, nullable=False),
    Column("incident_id", String(64)),
    Column("kind", String(50), nullable=False),
    Column("target", String(300), nullable=False),
    Column("status", String(20), nullable=False),
    Column("body", JSON, nullable=False),
    Index("ix_actions_incident", "incident_id"),
)

diagnoses = Table(
    "diagnoses", metadata,
    Column("incident_id", String(64), primary_key=True),
    Column("body", JSON, nullable=False),
)

# A diagnosis being run in the background (revision 0012): state running / done / failed / retrying, held by
# ``owner`` until ``lease_until`` while running, due again at ``lease_until`` while retrying; ``failures`` counts
# the failed runs since it was last asked for (revision 0014; see vigil.store.sql.Store.claim_diagnosis).
diagnosis_claims = Table(
    "diagnosis_claims", metadata,
    Column("incident_id", String(64), primary_key=True),
    Column("state", String(16), nullable=False),
    Column("owner", String(200), nullable=False),
    Column("claimed_at", Float, nullable=False),
    Column("lease_until", Float, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("error", Text, nullable=False),
    Column("failures", Integer, nullable=False, server_default="0"),
)

topology = Table(
    "topology", metadata,
    Column("id", Integer, primary_key=True),
    Column("body", JSON, nullable=False),
)

# What node agents push between scrapes: one row per push, the points as JSON ({metric, entity, value}).
metric_pushes = Table(
    "metric_pushes", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ts", Float, nullable=False),
    Column("node", String(300), nullable=False),
    Column("points", JSON, nullable=False),
    # What a push a sender may send again is (a launch report's step telemetry: its job and newest look; an agent's
    # push: its node and Idempotency-Key), NULL for the others. Unique: a retried push stores its samples once.
    Column("push_key", String(64), nullable=True),
    # the transaction that wrote the row, as for events
    Column("xid", BigInteger, nullable=False, server_default="0"),
    Index("ux_metric_pushes_push_key", "push_key", unique=True),
    Index("ix_metric_pushes_xid_id", "xid", "id"),
    # ids are a consumer's cursor: never hand out an id again after the newest rows were pruned
    sqlite_autoincrement=True,
)

# The keys of the metric pushes stored in the last push_key_window_s (server time), whether or not the engine has
# pruned their pushes: a push sent again within the window is stored once (vigil.store.sql.Store.add_samples).
metric_push_keys = Table(
    "metric_push_keys", metadata,
    Column("push_key", String(64), primary_key=True),
    Column("stored_at", Float, nullable=False),
    # What the push held (an agent's samples push: a digest of its samples), so that the key sent again with other
    # samples is told from the push sent again; NULL where the key alone says it (a launch report's telemetry) and
    # for the keys stored before revision 0010.
    Column("body_digest", String(64), nullable=True),
    Index("ix_metric_push_keys_stored_at", "stored_at"),
)

# How far a consumer (the engine) has read an append-only table; written after its outputs are stored.
cursors = Table(
    "cursors", metadata,
    Column("name", String(100), primary_key=True),
    Column("position", Float, nullable=False),
    Column("state", JSON, nullable=False),
)

# Each node's inventory as its agent registered it (GPUs, NICs), newest wins.
inventory = Table(
    "inventory", metadata,
    Column("node", String(300), primary_key=True),
    Column("ts", Float, nullable=False),
    Column("body", JSON, nullable=False),
)

# Every topology the store has held, so an incident can be read against the cluster as it was. A version is
# either the whole topology (node NULL) or one node as an agent registered it (node: its name, body: the node),
# which applies on top of the whole version before it.
topology_versions = Table(
    "topology_versions", metadata,
    Column("version", Integer, primary_key=True, autoincrement=True),
    Column("ts", Float, nullable=False),
    Column("source", String(100), nullable=False),
    Column("body", JSON, nullable=False),
    Column("node", String(300), nullable=True),
    Index("ix_topology_versions_node_version", "node", "version"),
)

# Each resolved incident summarized (root cause, actions, outcome): the memory similar incidents are found in.
incident_memories = Table(
    "incident_memories", metadata,
    Column("incident_id", String(64), primary_key=True),
    Column("end", Float, nullable=False),
    Column("body", JSON, nullable=False),
)

# The remedy package's tables (``remedy_*``; vigil.remedy.audit and vigil.remedy.lifecycle read and write them).

# The audit log: every action Vigil proposes, refuses, skips or executes, with who / why / what / result.
remedy_actions = Table(
    "remedy_actions", metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(40), nullable=False, unique=True),
    Column("ts", Float, nullable=False, index=True),
    Column("kind", String(40), nullable=False),
    Column("target", String(300), nullable=False, index=True),
    Column("incident_id", String(60)),
    Column("reason", Text, nullable=False),
    Column("requested_by", String(200), nullable=False),
    Column("dry_run", Boolean, nullable=False),
    Column("status", String(20), nullable=False),
    Column("result", Text, nullable=False),
    Column("params", JSON, nullable=False),
)

# Each node's lifecycle state (healthy, draining, repairing ...) and every move between states.
remedy_node_states = Table(
    "remedy_node_states", metadata,
    Column("node", String(300), primary_key=True),
    Column("state", String(30), nullable=False),
    Column("since", Float, nullable=False),
    Column("reason", Text, nullable=False),
    Column("repair_attempts", Integer, nullable=False, default=0),
)

remedy_node_transitions = Table(
    "remedy_node_transitions", metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("node", String(300), nullable=False, index=True),
    Column("ts", Float, nullable=False),
    Column("from_state", String(30), nullable=False),
    Column("to_state", String(30), nullable=False),
    Column("trigger", String(60), nullable=False),
    Column("reason", Text, nullable=False),
)

# The execution journal: one row per idempotency key, written before the back end is called and closed after.
# A row still "started" after a crash is an action that may be half done; running it again resumes it (every
# actuator call is idempotent: a drain evicts what is left, a cordon sets what is already set). ``owner`` names
# the remediator running it and ``lease_expires`` when its claim lapses unless renewed (the owner renews it while
# the action runs). Resuming is a claim on the row (``AuditLog.claim``), taken only once the lease has expired, so
# of several processes on one database that find the same row started (vigil serve --no-engine and vigil engine,
# after a crash), one resumes it, and none while its owner is alive.
remedy_intents = Table(
    "remedy_intents", metadata,
    Column("key", String(120), primary_key=True),
    Column("action_id", String(40), nullable=False),
    Column("state", String(20), nullable=False),
    Column("started", Float, nullable=False),
    Column("finished", Float),
    Column("action", JSON, nullable=False),
    Column("owner", String(120)),
    Column("lease_expires", Float),
)

# The back-end commands a run started (``vigil.remedy.commands``): one row per command, written before it starts
# (``marker``: in its environment as VIGIL_COMMAND, found in /proc when the process died before its pid was written)
# and given its process group once started - leader ``pid`` (= ``pgid``: a session of its own), the leader's start
# time in clock ticks since boot (/proc/<pid>/stat field 22, so a reused pid is not taken for it) and the ``host``.
# ``state``: starting, running, ended (its owner saw it end), or what the run's next owner found of it after the
# owner died: gone, killed, adopted (waited for) or unknown (on another host); abandoned: left open past the kept age
# with its run ended, so no owner would settle it (``abandon_unsettled``).
remedy_commands = Table(
    "remedy_commands", metadata,
    Column("marker", String(40), primary_key=True),
    Column("key", String(120), nullable=False, index=True),
    Column("owner", String(120), nullable=False),
    Column("kind", String(40), nullable=False),
    Column("argv", JSON, nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer),
    Column("pgid", Integer),
    Column("start_time", BigInteger),
    Column("state", String(20), nullable=False),
    Column("started", Float, nullable=False),
    Column("finished", Float),
    Column("result", Text),
    # the retention's two queries (revision 0015): settled rows by when they ended (``prune_settled``), open ones by
    # when they started (``abandon_unsettled``)
    Index("ix_remedy_commands_finished", "finished"),
    Index("ix_remedy_commands_state_started", "state", "started"),
)
