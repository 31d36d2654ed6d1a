"""Scrape a dcgm-exporter endpoint (default ``http://localhost:9400/metrics``) and keep its metric names.

The page is parsed with prometheus_client's own text parser. A corrupt page loses only its bad lines: when
the whole-page parse fails, the page is parsed again line by line and each unparseable line is counted. A
truncated page (a body cut off mid-line: the exposition format ends every line with a newline) drops its
last, partial line instead of storing a wrong value such as ``4`` for ``45``.

Labels: ``gpu`` becomes the entity ``gpu/<node>/<gpu>``; identity labels that never change for a GPU (UUID,
pci_bus_id, device, modelName, Hostname, driver version) are dropped from the series because the topology
already holds them; the rest (``xid``, ``err_code``, ``pod``, MIG ids, ...) go through the agent's label
guard, which folds or refuses the high-cardinality ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from vigil.knowledge.xid import xid_info
from vigil.model import Event, Gpu, gpu_id, node_id
from vigil.sources.collect.base import Collection, Source, default_node_name
from vigil.sources.collect.nvml import normalise_pci_bus

DEFAULT_URL = "http://localhost:9400/metrics"
XID_GAUGE = "DCGM_FI_DEV_XID_ERRORS"  # the last Xid a GPU reported
IDENTITY_LABELS = frozenset(
    {
        "gpu",
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "Hostname",
        "hostname",
        "DCGM_FI_DRIVER_VERSION",
        "window_size_in_ms",
    }
)


class XidGaugeChanges:
    """Xid events from dcgm-exporter's DCGM_FI_DEV_XID_ERRORS gauge, for nodes whose kernel log is not read.

    The gauge holds the *last* Xid until the exporter restarts (dcgm-exporter#190, #500), so only a change
    is news: the value seen at the first reading is history of unknown age, and a repeat of the same code
    is invisible here - the kernel log is the better source wherever the agent can read it.
    """

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def changes(self, readings: Iterable[tuple[str, int]], now: float) -> list[Event]:
        """One event per GPU whose gauge changed to a non-zero code since its previous reading."""
        events = []
        for entity, code in readings:
            previous = self._last.get(entity)
            self._last[entity] = code
            if previous is None or code == previous or code <= 0:
                continue
            info = xid_info(code)
            events.append(Event(
                ts=now, entity=entity, kind="xid", source="dcgm-exporter", level=info.level,
                message=f"Xid {code} ({info.mnemonic}) reported by dcgm-exporter",
                attrs={"xid": code, "mnemonic": info.mnemonic, "bucket": info.bucket, "action": info.action.value,
                       "known": info.known},
            ))
        return events


class DcgmExporterScraper(Source):
    name = "dcgm"
    kind = "gpu"

    def __init__(
        self,
        url: str = DEFAULT_URL,
        node: str | None = None,
        timeout_s: float = 5.0,
        client: httpx.Client | None = None,
        xid_events: bool = False,
    ) -> None:
        super().__init__()
        self.url = url
        self.node = node or default_node_name()
        self.timeout_s = timeout_s
        # Created on first scrape: building an httpx client (its TLS context) costs tens of milliseconds.
        self._client = client
        # PCI bus id -> GPU index from the page's labels: lets the kernel log name the GPU of an Xid on nodes
        # where the agent itself cannot open NVML.
        self.pci_to_index: dict[str, int] = {}
        # Each GPU's identity as the page's labels give it: the node's inventory when NVML is not readable here.
        self.gpus: dict[int, Gpu] = {}
        # Xid events from the exporter's "last Xid" gauge, for nodes whose kernel log the agent cannot read.
        self.xid_events = xid_events
        self._xid_watch = XidGaugeChanges()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def collect(self, now: float) -> Collection:
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout_s)
        try:
            response = self._client.get(self.url)
            response.raise_for_status()
        except httpx.HTTPError as err:
            self.problems.report("unreachable", f"{self.url}: {err}")
            return Collection(status=f"dcgm-exporter at {self.url} unreachable", up=False)
        return self.parse_page(response.text, now)

    def parse_page(self, page: str, now: float = 0.0) -> Collection:
        """Points of one exposition page; never raises on bad content."""
        out = Collection(status=f"dcgm-exporter at {self.url}")
        if not page.strip():
            self.problems.report("empty page", self.url)
            out.status = "dcgm-exporter returned an empty page"
            return out
        if not page.endswith("\n"):
            cut = page.rfind("\n")
            self.problems.report("truncated page", f"{self.url}: last line cut off: {page[cut + 1 :][:80]!r}")
            page = page[: cut + 1]
        try:
            families = list(text_string_to_metric_families(page))
        except ValueError as err:
            self.problems.report("corrupt page", f"{self.url}: {err}")
            families = self._parse_lines(page)
        for family in families:
            renamed = family.type == "counter" and self._parser_added_total(family.name, page)
            for sample in family.samples:
                name = sample.name.removesuffix("_total") if renamed else sample.name
                self._add_sample(out, name, sample.labels, sample.value)
        if self.xid_events:
            self._xid_changes(out, now)
        return out

    def _xid_changes(self, out: Collection, now: float) -> None:
        readings = [(p.entity, int(p.value)) for p in out.points if p.metric == XID_GAUGE]
        for event in self._xid_watch.changes(readings, now):
            if not event.attrs["known"]:
                self.problems.report("unknown Xid",
                                     f"Xid {event.attrs['xid']} on {event.entity} is not in the catalogue")
            out.events.append(event)

    @staticmethod
    def _parser_added_total(family: str, page: str) -> bool:
        """prometheus_client names counter samples ``<family>_total`` even when the page wrote ``<family>``
        (dcgm-exporter's DCGM_FI_DEV_PCIE_REPLAY_COUNTER): keep the exporter's own name."""
        return f"\n{family}_total" not in page and not page.startswith(f"{family}_total")

    def _parse_lines(self, page: str) -> list[Metric]:
        families: list[Metric] = []
        for line in page.splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            try:
                families.extend(text_string_to_metric_families(line + "\n"))
            except ValueError as err:
                self.problems.report("malformed line", f"{line[:120]!r}: {err}")
        return families

    def _add_sample(self, out: Collection, name: str, labels: dict[str, str], value: float) -> None:
        if math.isnan(value):
            return
        # The agent scrapes its own node's exporter, so the node is the agent's: the exporter's Hostname label
        # is the exporter pod's name under Kubernetes, not the node's.
        gpu = labels.get("gpu", "")
        entity = gpu_id(self.node, int(gpu)) if gpu.isdigit() else node_id(self.node)
        if gpu.isdigit() and "pci_bus_id" in labels:
            self.pci_to_index[normalise_pci_bus(labels["pci_bus_id"])] = int(gpu)
        if gpu.isdigit() and int(gpu) not in self.gpus:
            self.gpus[int(gpu)] = Gpu(node=self.node, index=int(gpu), uuid=labels.get("UUID", ""),
                                      model=labels.get("modelName", ""),
                                      pci_bus_id=normalise_pci_bus(labels.get("pci_bus_id", "")))
        extra = {k: v for k, v in labels.items() if k not in IDENTITY_LABELS}
        out.add(name, entity, value, **extra)
