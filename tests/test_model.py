from __future__ import annotations

import pytest

from vigil.model import (
    Anomaly,
    Evidence,
    FaultLevel,
    Incident,
    Topology,
    VigilInputError,
    covers,
    gpu_id,
    node_of,
    parse_entity,
    rank_id,
)


def test_entity_ids_parse() -> None:
    assert parse_entity(gpu_id("n012", 3)) == ("gpu", ("n012", "3"))
    assert parse_entity(rank_id("j7", 5)) == ("rank", ("j7", "5"))
    assert parse_entity("job/j7") == ("job", ("j7",))
    assert parse_entity("nic/n1/mlx5_0") == ("nic", ("n1", "mlx5_0"))


@pytest.mark.parametrize("bad", ["", "gpu/n1", "gpu/n1/x", "node/", "host/n1", "node/n1; rm -rf /"])
def test_bad_entity_ids_are_rejected(bad: str) -> None:
    with pytest.raises(VigilInputError, match="bad entity id"):
        parse_entity(bad)


def test_json_round_trip_keeps_everything() -> None:
    ev = Evidence(kind="metric", entity="gpu/n1/0", ts=10.0, summary="DBE count rose", metric="X", value=2)
    an = Anomaly(entity="gpu/n1/0", start=1, end=2, detector="rules", fault_type="gpu_dbe",
                 level=FaultLevel.ISOLATE, evidence=[ev])
    inc = Incident(title="t", scope="node/n1", entities=["gpu/n1/0"], start=1, end=2,
                   level=FaultLevel.ISOLATE, fault_types=["gpu_dbe"], anomalies=[an.id], evidence=[ev])
    assert Anomaly.from_json(an.to_json()) == an
    assert Incident.from_json(inc.to_json()) == inc


def test_validation_error_names_the_bad_field() -> None:
    with pytest.raises(VigilInputError) as info:
        Anomaly.from_dict({"entity": "gpu/n1/0", "start": "soon", "end": 2, "detector": "r",
                           "fault_type": "x", "level": 4})
    assert "'start'" in str(info.value)
    assert "\n" not in str(info.value)
    with pytest.raises(VigilInputError, match="'entity'"):
        Anomaly.from_dict({"entity": "gpu/n1", "start": 1, "end": 2, "detector": "r",
                           "fault_type": "x", "level": 4})


def test_fault_level_parse() -> None:
    assert FaultLevel.parse("isolate") is FaultLevel.ISOLATE
    assert FaultLevel.parse(2) is FaultLevel.DEGRADED
    with pytest.raises(VigilInputError, match="bad fault level"):
        FaultLevel.parse("panic")


def test_topology_helpers() -> None:
    topo = Topology.from_dict({"nodes": [{"name": "a", "switch": "s1"}, {"name": "b", "switch": "s2"}]})
    assert [n.name for n in topo.nodes_under("s1")] == ["a"]


def test_covers_is_the_entity_its_hardware_or_its_ranks() -> None:
    assert covers("node/n1", "node/n1") and covers("node/n1", "gpu/n1/3") and covers("node/n1", "nic/n1/mlx5_0")
    assert not covers("node/n1", "gpu/n10/3") and not covers("node/n1", "node/n10")
    assert covers("job/j7", "job/j7/rank/5") and not covers("job/j7", "job/j70/rank/5")
    assert not covers("job/j7/rank/5", "job/j7") and not covers("gpu/n1/3", "node/n1")
    assert [node_of(e) for e in ("gpu/n1/3", "nic/n1/ib0", "node/n1", "job/j7", "job/j7/rank/0")] == [
        "node/n1", "node/n1", "node/n1", None, None]
