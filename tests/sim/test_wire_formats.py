"""The fake cluster writes only what real machines write; the production decoders read it."""

from __future__ import annotations

import json

import pytest

from vigil.detect.rules import RuleDetector
from vigil.knowledge.faults import fault_catalogue
from vigil.sources.collect.kmsg import KernelLineParser
from vigil.sources.replay import KernelLineDecoder, decode_kube_events, decoded_events
from vigil.sources.sim import FaultPlan, SimConfig, simulate
from vigil.sources.sim.effects import EFFECTS

KERNEL_FAULTS = {
    # fault, entity it is injected on -> (decoded event kind, the entity the decoder names)
    ("gpu_dbe", "gpu/n001/3"): ("xid", "gpu/n001/3"),
    ("gpu_lost", "gpu/n002/0"): ("xid", "gpu/n002/0"),
    ("nic_lost", "nic/n001/mlx5_4"): ("kernel", "nic/n001/mlx5_4"),
    ("rnic_gid_error", "nic/n003/mlx5_2"): ("kernel", "nic/n003/mlx5_2"),
    ("link_down", "nic/n000/mlx5_6"): ("kernel", "nic/n000/mlx5_6"),
    ("cpu_mce", "node/n002"): ("kernel", "node/n002"),
    ("fs_readonly", "node/n003"): ("kernel", "node/n003"),
}


def one_fault(fault: str, entity: str) -> object:
    return simulate(SimConfig(nodes=4, gpus=8, minutes=20, seed=5, benign_noise=False,
                              plans=(FaultPlan(fault, entity, 480.0, 300.0),)))


def test_every_catalogue_fault_has_exactly_one_effect() -> None:
    assert set(EFFECTS) == set(fault_catalogue().faults)


def test_no_simulated_record_carries_a_label() -> None:
    run = simulate(SimConfig(nodes=8, gpus=8, minutes=60, seed=3, faults_per_node_hour=2.0))
    assert {e.kind for e in run.events} <= {"job", "ipmi_sel"}
    for event in run.events:
        assert not {"signature", "sensor", "xid", "fault", "fault_type"} & set(event.attrs)
    parser = KernelLineParser(boot_time=0.0)
    kernel = [r for r in run.logs if r.source == "kernel"]
    assert kernel and all(parser.parse(r.line, 0.0) is not None for r in kernel)


@pytest.mark.parametrize(("fault", "entity"), sorted(KERNEL_FAULTS))
def test_the_production_kernel_decoder_reads_every_simulated_kernel_line(fault: str, entity: str) -> None:
    run = one_fault(fault, entity)
    lines = [r for r in run.logs if r.source == "kernel"]
    events = KernelLineDecoder(run.topology).decode(lines)
    assert lines and events  # a follow-up line (EXT4's journal abort, mlx5's recovery abort) may add nothing
    kind, decoded_entity = KERNEL_FAULTS[(fault, entity)]
    assert {(e.kind, e.entity) for e in events} == {(kind, decoded_entity)}
    detector = RuleDetector(run.topology)
    detector.update([], decoded_events(run.topology, [], lines))
    # a kernel link-down is judged once no link-up followed within the flap window: read what the detector closed
    assert (entity, fault) in {(a.entity, a.fault_type) for a in detector.close()}


def test_ipmi_records_are_what_ipmitool_prints() -> None:
    run = one_fault("psu_failure", "node/n001")
    (sel,) = [e for e in run.events if e.kind == "ipmi_sel"]
    assert sel.attrs == {} and sel.message.split(" | ")[1:] == ["Failure detected", "Asserted"]
    found = RuleDetector(run.topology).update([], [sel])
    assert [(a.entity, a.fault_type) for a in found] == [("node/n001", "psu_failure")]


def test_kubernetes_events_are_api_objects_read_by_the_kubernetes_sources_decoder() -> None:
    run = one_fault("kernel_panic", "node/n002")
    (record,) = run.kube_events
    raw = json.loads(record.line)
    assert (raw["kind"], raw["involvedObject"], raw["type"], raw["reason"]) == (
        "Event", {"apiVersion": "v1", "kind": "Node", "name": "n002", "uid": "n002"}, "Normal", "NodeNotReady")
    assert {"firstTimestamp", "lastTimestamp", "count", "source", "metadata", "message"} <= set(raw)
    events = decode_kube_events(run.kube_events)
    assert [(e.kind, e.entity, e.attrs["reason"]) for e in events] == [("k8s", "node/n002", "NodeNotReady")]
    found = RuleDetector(run.topology).update([], events)
    assert ("node/n002", "node_not_ready") in {(a.entity, a.fault_type) for a in found}
