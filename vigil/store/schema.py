"""The relational schema (SQLAlchemy Core). Changes go through a new alembic revision in migrations/."""

from __future__ import annotations

from sqlalchemy import JSON, Column, Float, Index, Integer, MetaData, String, Table, Text

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
    Index("ix_events_ts", "ts"),
    Index("ix_events_entity_ts", "entity", "ts"),
    Index("ux_events_push_key", "push_key", unique=True),
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
    # ids are a consumer's cursor: never hand out an id again after the newest rows were pruned
    sqlite_autoincrement=True,
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
