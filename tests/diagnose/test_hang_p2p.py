"""P2P progress: one schema for gloo posted/done and NCCL proxy counters; ring rebuild and culprit link."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vigil.diagnose.hang_source import diagnose_path
from vigil.diagnose.p2p import P2PState, analyse, rebuild_rings, states_from_nccl_proxy, states_from_probe
from vigil.model import VigilInputError
from vigil.sources.probe.records import P2P, OpRecord

NSTEPS = 8


def ring_states(world: int, fault: dict[tuple[int, str], dict[str, int]] | None = None) -> list[dict[str, int | str]]:
    """Proxy counters of a ring on one channel, all done unless ``fault`` overrides (rank, op)."""
    records: list[dict[str, int | str]] = []
    for rank in range(world):
        for op, peer in (("send", (rank + 1) % world), ("recv", (rank - 1) % world)):
            counters = {"posted": NSTEPS, "received": NSTEPS, "transmitted": NSTEPS, "done": NSTEPS}
            counters.update((fault or {}).get((rank, op), {}))
            records.append({"rank": rank, "peer": peer, "op": op, "channel": 0, "opCount": 5,
                            "nsteps": NSTEPS, **counters})
    return records


def test_status_letters_follow_nccl_rules() -> None:
    assert P2PState(0, 1, "send", 1, nsteps=4, posted=4, transmitted=2, done=2).status == "G"
    assert P2PState(0, 1, "send", 1, nsteps=4, posted=4, transmitted=4, done=2).status == "S"
    assert P2PState(0, 1, "recv", 1, nsteps=4, posted=4, received=1, done=1).status == "R"
    assert P2PState(0, 1, "recv", 1, nsteps=4, posted=4, received=4, transmitted=2, done=2).status == "F"
    assert P2PState(0, 1, "recv", 1, nsteps=4, posted=4, received=4, transmitted=4, done=2).status == "G"
    assert P2PState(0, 1, "recv", 1, nsteps=4, posted=4, received=4, transmitted=4, done=4).status == "D"


def test_ring_is_rebuilt_from_send_edges() -> None:
    states = states_from_nccl_proxy(ring_states(6))
    assert rebuild_rings(states) == {0: [0, 1, 2, 3, 4, 5]}


def test_broken_link_is_named_not_the_downstream_ranks() -> None:
    # Link 2 -> 3 drops data: 2 transmitted everything, 3 received only 3 steps. Downstream ranks wait
    # for GPU data (G) because their own recv is stuck; they must not be blamed.
    fault = {
        (2, "send"): {"done": 3},
        (3, "recv"): {"received": 3, "transmitted": 3, "done": 3},
        (3, "send"): {"transmitted": 3, "done": 3},
        (4, "recv"): {"received": 3, "transmitted": 3, "done": 3},
        (4, "send"): {"transmitted": 3, "done": 3},
    }
    analysis = analyse(states_from_nccl_proxy(ring_states(6, fault)))
    assert analysis.culprit_links == [[2, 3]]
    assert analysis.culprit_ranks == []


def test_rank_whose_gpu_never_produces_data_is_the_culprit() -> None:
    fault = {(1, "send"): {"transmitted": 0, "done": 0}, (2, "recv"): {"received": 0, "transmitted": 0, "done": 0}}
    analysis = analyse(states_from_nccl_proxy(ring_states(4, fault)))
    assert analysis.culprit_ranks == [1]
    assert analysis.culprit_links == [[1, 2]]


def test_missing_recv_names_receiver_and_link() -> None:
    records = [r for r in ring_states(4, {(0, "send"): {"transmitted": NSTEPS, "done": 0}})
               if not (r["rank"] == 1 and r["op"] == "recv")]
    analysis = analyse(states_from_nccl_proxy(records))
    assert analysis.culprit_ranks == [1]
    assert analysis.culprit_links == [[0, 1]]


def test_gloo_probe_records_map_onto_the_same_schema() -> None:
    def op(rank: int, direction: str, peer: int, state: str) -> OpRecord:
        return OpRecord(record_id=0, group="0", group_ranks=[0, 1, 2], kind=P2P, seq=1, op=direction,
                        peer=peer, state=state, t_start=1.0)

    ops = {
        0: [op(0, "send", 1, "completed"), op(0, "recv", 2, "completed")],
        1: [op(1, "send", 2, "started"), op(1, "recv", 0, "completed")],
        2: [op(2, "send", 0, "completed")],  # rank 2 never posted its recv from 1
    }
    states = states_from_probe(ops)
    assert {s.status for s in states if s.rank == 1 and s.direction == "send"} == {"S"}
    analysis = analyse(states)
    assert analysis.culprit_ranks == [2]
    assert analysis.culprit_links == [[1, 2]]


def test_bad_proxy_record_is_one_clear_error() -> None:
    with pytest.raises(VigilInputError, match="NCCL proxy state #0"):
        states_from_nccl_proxy([{"rank": 0, "peer": 1, "op": "bcast", "nsteps": 1}])


def test_tree_broadcast_stall_names_the_edge() -> None:
    # Tree 0 -> {1, 2}, 1 -> {3, 4}: the 1 -> 4 edge stalls; 3 and the other edges are fine.
    edges = [(0, 1), (0, 2), (1, 3), (1, 4)]
    records: list[dict[str, int | str]] = []
    for src, dst in edges:
        stuck = (src, dst) == (1, 4)
        records.append({"rank": src, "peer": dst, "op": "send", "nsteps": NSTEPS, "posted": NSTEPS,
                        "transmitted": NSTEPS, "done": 2 if stuck else NSTEPS, "opCount": 9})
        records.append({"rank": dst, "peer": src, "op": "recv", "nsteps": NSTEPS, "posted": NSTEPS,
                        "received": 2 if stuck else NSTEPS, "transmitted": 2 if stuck else NSTEPS,
                        "done": 2 if stuck else NSTEPS, "opCount": 9})
    analysis = analyse(states_from_nccl_proxy(records))
    assert analysis.culprit_links == [[1, 4]]
    assert analysis.waiting == {4: 1}


def test_vigil_diagnose_reads_a_proxy_state_file(tmp_path: Path) -> None:
    fault = {(1, "send"): {"transmitted": 0, "done": 0}, (2, "recv"): {"received": 0, "transmitted": 0, "done": 0}}
    path = tmp_path / "proxy.json"
    path.write_text(json.dumps({"nccl_proxy": ring_states(4, fault)}))
    diagnosis = diagnose_path(path)
    assert (diagnosis.verdict, diagnosis.hang_kind, diagnosis.culprit_ranks) == ("hang", "p2p", [1])
    assert "0 -> 1 -> 2 -> 3" in diagnosis.summary
    path.write_text(json.dumps({"nccl_proxy": ring_states(4)}))
    assert diagnose_path(path).verdict == "ok"
    path.write_text("[{")
    with pytest.raises(VigilInputError, match="not valid JSON"):
        diagnose_path(path)


def _pending(rank: int, peer: int, direction: str, seq: int, t_start: float, done: float = 0.0) -> P2PState:
    """A gloo op as the probe records it (one step, posted), with when it was posted and when seen done."""
    finished = 1 if done else 0
    return P2PState(rank, peer, direction, seq, posted=1, transmitted=1 if direction == "send" else finished,
                    received=finished, done=finished, t_start=t_start, t_end=done)


def test_pipeline_stage_that_posted_one_recv_too_few_is_the_culprit_not_the_stage_it_blocks() -> None:
    # Stages 0-3. Stage 3 posted 3 activation recvs where stage 2 sent 4, then sent 3 gradients back. Stage 2
    # waits in its 4th send and so never posts the gradient recvs (nor sends its own gradients to stage 1):
    # every one of those is stage 3's consequence; the link is 2 -> 3.
    # Stage 2 posted its four sends together and waited on them in turn (the first three seen done after the
    # fourth was posted); the two pending sends' posting times are a tie at the clock's resolution, or the
    # wrong way round (stage 2 posted its 4th send 0.15 ms after stage 3 began sending its gradients).
    for last_send_posted in (10.50, 10.5015):
        states = [
            *[_pending(2, 3, "send", s, 10.49, done=10.51) for s in (1, 2, 3)],
            _pending(2, 3, "send", 4, last_send_posted),
            *[_pending(3, 2, "recv", s, 10.4, done=10.495) for s in (1, 2, 3)],
            *[_pending(3, 2, "send", s, 10.5) for s in (1, 2, 3)],
            *[_pending(1, 2, "recv", s, 10.48) for s in (1, 2, 3, 4)],
            *[_pending(0, 1, "recv", s, 10.47) for s in (1, 2, 3, 4)],
        ]
        analysis = analyse(states)
        assert analysis.culprit_ranks == [3]
        assert analysis.culprit_links == [[2, 3]]


def test_rank_that_moved_on_is_the_culprit_of_the_waits_behind_it() -> None:
    # Rank 1 waits to send to 2; rank 2 never posted that recv and waits in nothing p2p (it went on to a
    # collective); rank 0 waits for rank 1's send. Rank 1's missing send to 0 is explained by its own wait.
    states = [_pending(1, 2, "send", 1, 5.0), _pending(0, 1, "recv", 1, 4.0)]
    analysis = analyse(states)
    assert analysis.culprit_ranks == [2]
