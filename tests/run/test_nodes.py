"""One verdict per multi-node job: exactly one node's claim stands, and it is never seen half-written."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from vigil.run.nodes import CLAIM_FILE, NodeGroup


def test_one_claim_stands_and_is_whole_when_it_appears(tmp_path: Path) -> None:
    nodes = [NodeGroup(tmp_path, 4, n) for n in range(4)]
    barrier = threading.Barrier(4)
    won: list[int] = []
    seen: list[str] = []

    def race(node: NodeGroup) -> None:
        barrier.wait()
        if node.claim("hang"):
            won.append(node.node_rank)
        path = tmp_path / CLAIM_FILE
        if path.exists():
            seen.append(path.read_text())

    threads = [threading.Thread(target=race, args=(node,)) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1
    assert all(json.loads(text)["node_rank"] == won[0] for text in seen)
    assert {node.claimer() for node in nodes} == {won[0]}
    assert [node.node_rank for node in nodes if node.claimed_by_other()] == sorted(set(range(4)) - set(won))
    assert not list(tmp_path.glob(".claim.*"))
