"""A site for the engine tests: a store with two registered nodes, their agents' decoders (the production ones) and
an engine on it, on a clock the test moves."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from tests.run.clock import Clock
from tests.run.pages import dcgm_page, xid_line
from vigil.config import Settings
from vigil.model import Event, Node, Sample
from vigil.run.engine import Engine
from vigil.sources.collect.dcgm import DcgmExporterScraper
from vigil.sources.collect.kmsg import KernelLogSource
from vigil.store.sql import Store

NODES = ("n01", "n02")


class Site:
    """A store with two registered nodes, their agents' decoders (the production ones) and an engine on it."""

    def __init__(self, db_url: str, home: Path) -> None:
        self.settings = Settings(home=home, db_url=db_url, resolve_after_s=120.0)
        self.store = Store(db_url)
        self.clock = Clock()
        self.scrapers = {n: DcgmExporterScraper("http://unused", node=n) for n in NODES}
        for node, scraper in self.scrapers.items():
            scraper.parse_page(dcgm_page(node), self.clock.now)
            self.store.register_node(Node(name=node, gpus=list(scraper.gpus.values())))

    def engine(self) -> Engine:
        return Engine(self.store, self.settings, notifiers=[], clock=self.clock)

    def xid(self, node: str, gpu: int) -> Event:
        scraper = self.scrapers[node]
        kernel = KernelLogSource(lambda: [], node=node, gpu_index=lambda pci: scraper.pci_to_index.get(pci))
        event = kernel.decode(xid_line(gpu=gpu), self.clock.now)
        assert event is not None and event.entity == f"gpu/{node}/{gpu}"
        return event

    def samples(self, node: str) -> list[Sample]:
        page = self.scrapers[node].parse_page(dcgm_page(node), self.clock.now)
        return [Sample(ts=self.clock.now, entity=p.entity, metric=p.metric, value=p.value) for p in page.points]

    def held(self) -> sa.Connection:
        """A writer's connection of its own, its transaction begun: what it inserts is visible once it commits."""
        conn = self.store.engine.connect()
        conn.begin()
        return conn
