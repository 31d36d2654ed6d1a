"""Replayed raw records -> events through the production decoders, for any source that hands over raw lines.

The node agent decodes its own kernel log (``vigil.sources.collect.kmsg``); a source that delivers raw kernel
lines instead - a replayed dmesg capture, the fake cluster of ``vigil demo`` - goes through the same decoder
here, one per node, with PCI addresses resolved through the topology's inventory exactly as the agent
resolves them through NVML and sysfs. Kubernetes Event objects handed over as the API's JSON go through the
Kubernetes source's own decoder (``vigil.sources.collect.kube.decode_event``). Training ranks' log lines go
through the rank-log decoder (``vigil.sources.collect.ranklog``) a log forwarder uses.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from vigil.model import Event, LogRecord, Topology, parse_entity
from vigil.sources.collect.kmsg import KernelLogSource
from vigil.sources.collect.kube import decode_event
from vigil.sources.collect.nvml import normalise_pci_bus
from vigil.sources.collect.ranklog import decode_rank_line

log = logging.getLogger("vigil.replay")


class KernelLineDecoder:
    """One ``KernelLogSource`` decoder per node of the topology."""

    def __init__(self, topology: Topology) -> None:
        self._decoders: dict[str, KernelLogSource] = {}
        for node in topology.nodes:
            gpus = {normalise_pci_bus(g.pci_bus_id): g.index for g in node.gpus if g.pci_bus_id}
            nics = {c.pci_bus_id.lower(): c.name for c in node.nics if c.pci_bus_id}
            self._decoders[node.name] = KernelLogSource(
                lambda: (), node=node.name, gpu_index=gpus.get, nic_name=nics.get,
                origin=f"kernel lines of {node.name}", boot_time=0.0)

    def decode(self, records: Iterable[LogRecord]) -> list[Event]:
        """Events of the kernel lines among ``records`` (lines of nodes outside the topology are skipped)."""
        events = []
        for record in records:
            if record.source != "kernel":
                continue
            kind, parts = parse_entity(record.entity)
            decoder = self._decoders.get(parts[0]) if kind == "node" else None
            if decoder is None:
                continue
            event = decoder.decode(record.line, record.ts or 0.0)
            if event is not None:
                events.append(event)
        return events


def decode_kube_events(records: Iterable[LogRecord]) -> list[Event]:
    """Events of the Kubernetes Event objects among ``records`` (source "kubernetes", one JSON object per line);
    a line that is not a JSON object is logged and skipped."""
    events = []
    for record in records:
        if record.source != "kubernetes":
            continue
        try:
            raw = json.loads(record.line)
        except ValueError:
            raw = None
        if not isinstance(raw, dict):
            log.warning("%s line %s: not a Kubernetes Event object (expected one JSON object); skipped",
                        record.entity, record.lineno or "?")
            continue
        event = decode_event(raw, record.ts or 0.0)
        if event is not None:
            events.append(event)
    return events


def decode_rank_lines(records: Iterable[LogRecord]) -> list[Event]:
    """Events of the rank log lines among ``records`` (source "rank", on a rank entity, with a time)."""
    events = []
    for record in records:
        if record.source != "rank" or record.ts is None or parse_entity(record.entity)[0] != "rank":
            continue
        event = decode_rank_line(record.entity, record.line, record.ts)
        if event is not None:
            events.append(event)
    return events


def decoded_events(topology: Topology, events: Iterable[Event], logs: Iterable[LogRecord]) -> list[Event]:
    """``events`` plus the events decoded from the kernel lines and Kubernetes Event objects in ``logs``, in
    time order."""
    records = list(logs)
    return sorted([*events, *KernelLineDecoder(topology).decode(records), *decode_kube_events(records)],
                  key=lambda e: e.ts)
