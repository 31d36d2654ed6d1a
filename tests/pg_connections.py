"""How many connections the suite's PostgreSQL servers hold: sampled at the end of every test's call and after its
teardown, on one connection of the monitor's own (not counted). A test that ends holding more client connections than
it began with (after its teardown) is listed as a leak; the peak over the session is printed at its end.

``--pg-connections`` prints every test's leak and the databases still connected at the end; without it, one line (the
peak) wherever a server ran."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

# client backends only: PostgreSQL's own processes (autovacuum, walwriter ...) hold no slot of max_connections
COUNT = ("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
BY_DATABASE = ("SELECT coalesce(datname, ''), count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
               "AND pid <> pg_backend_pid() GROUP BY 1 ORDER BY 2 DESC, 1")


@dataclass
class Server:
    url: str
    conn: Any
    peak: int = 0
    peak_test: str = ""
    # what was still connected when the server was about to stop: (database, connections)
    left: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class Monitor:
    servers: list[Server] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # per test: client connections (over every server) left after its teardown beyond those before its setup
    leaks: dict[str, int] = field(default_factory=dict)
    before: int = 0
    # servers watched once and since stopped
    finished: list[Server] = field(default_factory=list)

    def watch(self, url: str) -> None:
        """Sample the server at ``url`` (a SQLAlchemy postgresql+psycopg URL) from now until ``forget``."""
        import psycopg

        conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True,
                               application_name="vigil-tests-monitor")
        with self.lock:
            self.servers.append(Server(url, conn))

    def forget(self, url: str) -> None:
        with self.lock:
            for server in [s for s in self.servers if s.url == url]:
                self.servers.remove(server)
                server.left = [(str(name), int(n)) for name, n in server.conn.execute(BY_DATABASE).fetchall()]
                server.conn.close()
                self.finished.append(server)

    def count(self, test: str) -> int:
        """The client connections on every watched server now (the peaks updated)."""
        total = 0
        with self.lock:
            for server in self.servers:
                now = int(server.conn.execute(COUNT).fetchone()[0])
                if now > server.peak:
                    server.peak, server.peak_test = now, test
                total += now
        return total

    def left_after(self, test: str, settle_s: float = 2.0) -> int:
        """How many more client connections there are now than before ``test``'s setup. A backend whose client
        closed its connection leaves pg_stat_activity only once its process has ended, a moment later: counted again
        until none is left over, or ``settle_s`` has passed (a real leak)."""
        deadline = time.monotonic() + settle_s
        while True:
            left = self.count(test) - self.before
            if left <= 0 or time.monotonic() >= deadline:
                return left
            time.sleep(0.02)

    def seen(self) -> list[Server]:
        """Every server watched in this session, the stopped ones first."""
        with self.lock:
            return self.finished + self.servers

    def peak(self) -> tuple[int, str, int]:
        """The most client connections one server held (and at the end of which test), and how many servers ran."""
        seen = self.seen()
        best = max(seen, key=lambda s: s.peak, default=None)
        return (best.peak, best.peak_test, len(seen)) if best else (0, "", 0)


MONITOR = Monitor()
