from __future__ import annotations

import numpy as np
import pytest

from vigil.detect.incidents import IncidentGrouper
from vigil.detect.rules import RuleDetector
from vigil.knowledge.faults import fault_level
from vigil.model import Anomaly, Event, FaultLevel
from vigil.run.pipeline import run_pipeline
from vigil.sources.sim import FaultPlan, SimConfig, simulate
from vigil.sources.sim import metrics as M
from vigil.sources.sim.cluster import build_topology
from vigil.sources.sim.faults import CATALOGUE
from vigil.store.metrics import MetricFrame
from vigil_eval.scoring import score

TOPO = build_topology(nodes=4, gpus=8)
GPUS = [g.id for n in TOPO.nodes for g in n.gpus]


def gpu_frame(ts: float, **overrides: dict[int, float]) -> MetricFrame:
    values = np.zeros((len(GPUS), len(M.GPU_METRICS)), dtype=np.float32)
    gi = M.index("gpu")
    values[:, gi["DCGM_FI_DEV_GPU_TEMP"]] = 70
    values[:, gi["DCGM_FI_DEV_PCIE_LINK_WIDTH"]] = 16
    values[:, gi["DCGM_FI_DEV_SM_CLOCK"]] = 1980
    values[:, gi["DCGM_FI_DEV_GPU_UTIL"]] = 95
    for metric, cells in overrides.items():
        for row, value in cells.items():
            values[row, gi[metric]] = value
    return MetricFrame(ts, "gpu", GPUS, M.GPU_METRICS, values)


def test_thresholds_fire_on_the_right_gpu_only() -> None:
    det = RuleDetector(TOPO)
    assert det.update([gpu_frame(0)], []) == []
    found = det.update([gpu_frame(10, DCGM_FI_DEV_GPU_TEMP={5: 93}, DCGM_FI_DEV_PCIE_LINK_WIDTH={9: 8})], [])
    assert {(a.entity, a.fault_type) for a in found} == {(GPUS[5], "gpu_thermal"), (GPUS[9], "gpu_pcie_width_low")}
    thermal = next(a for a in found if a.fault_type == "gpu_thermal")
    assert thermal.level is FaultLevel.DEGRADED and thermal.evidence[0].value == 93


def test_counter_rules_use_rates_and_ignore_resets() -> None:
    det = RuleDetector(TOPO)
    det.update([gpu_frame(0, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL={1: 5}, DCGM_FI_DEV_PCIE_REPLAY_COUNTER={2: 1000})], [])
    found = det.update([gpu_frame(10, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL={1: 6},
                                  DCGM_FI_DEV_PCIE_REPLAY_COUNTER={2: 0})], [])
    assert [(a.entity, a.fault_type) for a in found] == [(GPUS[1], "gpu_dbe")]


def test_a_held_condition_extends_one_anomaly() -> None:
    det = RuleDetector(TOPO)
    for ts in range(0, 100, 10):
        det.update([gpu_frame(ts, DCGM_FI_DEV_GPU_TEMP={0: 95})], [])
    closed = det.close()
    assert len(closed) == 1 and (closed[0].start, closed[0].end) == (0, 90)


def test_xid_events_map_through_the_catalogue() -> None:
    det = RuleDetector(TOPO)
    found = det.update([], [Event(ts=1, entity=GPUS[3], kind="xid", attrs={"xid": 79}),
                            Event(ts=1, entity=GPUS[4], kind="xid", attrs={"xid": 13}),
                            Event(ts=1, entity=GPUS[6], kind="xid", attrs={"xid": 4242})])
    by_gpu = {a.entity: a for a in found}
    assert by_gpu[GPUS[3]].fault_type == "gpu_lost" and by_gpu[GPUS[3]].level is FaultLevel.ISOLATE
    assert by_gpu[GPUS[4]].fault_type == "gpu_app_error" and by_gpu[GPUS[4]].level is FaultLevel.OBSERVE
    assert by_gpu[GPUS[6]].level is FaultLevel.DRAIN and det.unknown_xids == 1


def test_straggler_is_found_by_peer_difference() -> None:
    det = RuleDetector(TOPO)
    found = det.update([gpu_frame(0, DCGM_FI_DEV_SM_CLOCK={17: 1300})], [])
    job = TOPO.jobs[0] if GPUS[17] in TOPO.jobs[0].placement else TOPO.jobs[1]
    rank = job.placement.index(GPUS[17])
    assert [(a.entity, a.fault_type) for a in found] == [(f"job/{job.id}/rank/{rank}", "straggler")]


def test_checkpoint_stall_is_not_a_hang_but_a_silent_stall_is() -> None:
    run = simulate(SimConfig(nodes=2, minutes=60, seed=2, faults_per_node_hour=0, benign_noise=False))
    result = run_pipeline(run)
    assert result.incidents == [], "checkpoint pauses must not page anyone"
    hang = FaultPlan("job_hang", "job/j00/rank/3", start_s=30 * 60, duration_s=14 * 60)
    run = simulate(SimConfig(nodes=2, minutes=60, seed=2, plans=(hang,), benign_noise=False))
    result = run_pipeline(run)
    # The job's stall opens the incident; the ranks' watchdog timeouts, which rank 3 alone does not print,
    # narrow it to rank 3.
    [incident] = result.incidents
    assert incident.scope == "job/j00/rank/3"
    assert any("7 of 8 ranks of job/j00 timed out in collective SeqNum 18231" in e.summary for e in incident.evidence)
    found = score(result.incidents, run.ground_truth, run.topology)
    assert found.recall == 1.0
    assert found.matches[0].delay_s is not None and found.matches[0].delay_s <= 120


def test_the_demo_localizes_every_fault_it_detects() -> None:
    """`vigil demo`'s run (16 nodes, seed 0): the hung rank and three single-NIC faults under one leaf switch
    (a slow link, a flapping then dead link, a GID table error) are each found on their own entity."""
    run = simulate(SimConfig(nodes=16, gpus=8, minutes=60, seed=0))
    result = run_pipeline(run)
    found = score(result.incidents, run.ground_truth, run.topology)
    assert (found.precision, found.recall, found.localization) == (1.0, 1.0, 1.0)
    scopes = {m.entity: m.incident_scope for m in found.matches if m.incident_id}
    assert scopes["job/j00/rank/40"] == "job/j00/rank/40"
    assert [scopes[m.entity] for m in found.matches if m.entity.startswith("nic/")] == [
        m.entity for m in found.matches if m.entity.startswith("nic/")]


@pytest.mark.parametrize("spec", [s for s in CATALOGUE if s.visible_to_rules], ids=lambda s: s.name)
def test_every_rule_visible_fault_is_detected_and_localized(spec) -> None:  # type: ignore[no-untyped-def]
    run = simulate(SimConfig(nodes=8, minutes=45, seed=11, fault_types=(spec.name,), faults_per_node_hour=0.3))
    assert run.ground_truth, "the schedule placed at least one fault"
    result = run_pipeline(run)
    found = score(result.incidents, run.ground_truth, run.topology)
    assert found.recall == 1.0, [m for m in found.matches if not m.incident_id]
    assert found.precision == 1.0
    assert found.localization >= 0.5


def test_switch_failure_becomes_one_switch_incident() -> None:
    plan = FaultPlan("switch_failure", "switch/leaf01", start_s=20 * 60, duration_s=10 * 60)
    run = simulate(SimConfig(nodes=8, minutes=40, seed=3, plans=(plan,), benign_noise=False))
    result = run_pipeline(run)
    switch_incidents = [i for i in result.incidents if i.scope == "switch/leaf01"]
    assert len(switch_incidents) == 1
    assert {e.split("/")[1] for e in switch_incidents[0].entities if e.startswith("nic/")} == {
        n.name for n in run.topology.nodes_under("leaf01")}


def test_only_links_going_down_together_under_a_switch_make_a_switch_incident() -> None:
    # A NIC that negotiated a low speed, a link flapping on the next node 90 s later and a GID table error on
    # a third: three NICs' own faults under one switch.
    own = IncidentGrouper(TOPO)
    own.add([_job_anomaly("nic/n001/mlx5_1", "nic_speed_low", 0), _job_anomaly("nic/n000/mlx5_2", "link_flap", 90),
             _job_anomaly("nic/n003/mlx5_7", "rnic_gid_error", 120)])
    assert sorted(i.scope for i in own.incidents(now=200)) == ["nic/n000/mlx5_2", "nic/n001/mlx5_1",
                                                                "nic/n003/mlx5_7"]
    # Two links down on two nodes a minute apart: 2 of the switch's 32 links, two cables.
    cables = IncidentGrouper(TOPO)
    cables.add([_job_anomaly("nic/n001/mlx5_1", "link_down", 0), _job_anomaly("nic/n000/mlx5_2", "link_down", 60)])
    assert sorted(i.scope for i in cables.incidents(now=200)) == ["nic/n000/mlx5_2", "nic/n001/mlx5_1"]
    # Every link of two of its four nodes down together: the switch they share.
    switch = IncidentGrouper(TOPO)
    switch.add([_job_anomaly(nic.id, "link_down", 0) for node in TOPO.nodes[:2] for nic in node.nics])
    assert [i.scope for i in switch.incidents(now=200)] == [f"switch/{TOPO.nodes[0].switch}"]


def test_observations_do_not_open_incidents() -> None:
    grouper = IncidentGrouper(TOPO)
    det = RuleDetector(TOPO)
    grouper.add(det.update([], [Event(ts=5, entity=GPUS[0], kind="xid", attrs={"xid": 13})]))
    assert grouper.incidents(now=10) == [] and len(grouper.observations) == 1


def _job_anomaly(entity: str, fault: str, start: float) -> Anomaly:
    return Anomaly(entity=entity, start=start, end=start, detector="rules", fault_type=fault,
                   level=fault_level(fault))


def test_a_job_incident_narrows_to_the_one_rank_named_unless_the_job_is_worse_off() -> None:
    grouper = IncidentGrouper(TOPO)
    grouper.add([_job_anomaly("job/j00", "throughput_drop", 10)])
    assert [i.scope for i in grouper.incidents(now=20)] == ["job/j00"]
    grouper.add([_job_anomaly("job/j00/rank/3", "straggler", 30)])
    [incident] = grouper.incidents(now=40)
    assert incident.scope == "job/j00/rank/3" and incident.title == "straggler on job/j00/rank/3"
    # A stall of the whole job is worse than one slow rank: the rank does not explain it.
    grouper.add([_job_anomaly("job/j00", "job_hang", 50)])
    assert [i.scope for i in grouper.incidents(now=60)] == ["job/j00"]
    # Two ranks named: the job is what they have in common.
    other = IncidentGrouper(TOPO)
    other.add([_job_anomaly("job/j00", "throughput_drop", 10), _job_anomaly("job/j00/rank/3", "straggler", 30),
               _job_anomaly("job/j00/rank/5", "straggler", 31)])
    assert [i.scope for i in other.incidents(now=40)] == ["job/j00"]


def test_agent_events_take_the_fault_catalogue_level() -> None:
    """Whatever level a source wrote, a finding is reported at the one level the fault catalogue gives it."""
    det = RuleDetector(TOPO)
    found = det.update([], [
        Event(ts=1, entity=GPUS[2], kind="gpu_recovery_action", source="nvml", level=FaultLevel.OBSERVE,
              attrs={"action": "GPU_RESET"}),
        Event(ts=1, entity="node/n000", kind="kernel", level=FaultLevel.DEGRADED, attrs={"signature": "oom_kill"}),
        Event(ts=1, entity="nic/n001/mlx5_0", kind="rnic_gid_error", source="sysfs", level=FaultLevel.OBSERVE),
    ])
    assert {(a.entity, a.fault_type, a.level) for a in found} == {
        (GPUS[2], "gpu_recovery_action", fault_level("gpu_recovery_action")),
        ("node/n000", "host_oom", fault_level("host_oom")),
        ("nic/n001/mlx5_0", "rnic_gid_error", fault_level("rnic_gid_error"))}


def test_a_healthy_nic_is_judged_by_its_own_rated_speed() -> None:
    """A 200 Gb/s NIC running at 200 Gb/s is healthy; the same NIC at 100 Gb/s is slow."""
    topo = build_topology(nodes=1, gpus=2)
    for nic in topo.nodes[0].nics:
        nic.speed_gbps = 200.0
    nics = [c.id for c in topo.nodes[0].nics]
    names = ("vigil_nic_link_up", "vigil_nic_speed_gbps")
    det = RuleDetector(topo)
    healthy = np.array([[1.0, 200.0]] * len(nics), dtype=np.float32)
    assert det.update([MetricFrame(0, "nic", nics, names, healthy)], []) == []
    slow = healthy.copy()
    slow[1, 1] = 100.0
    found = det.update([MetricFrame(10, "nic", nics, names, slow)], [])
    assert [(a.entity, a.fault_type, a.level) for a in found] == [
        (nics[1], "nic_speed_low", fault_level("nic_speed_low"))]


def test_a_partial_node_frame_judges_what_it_holds() -> None:
    """A node frame with only vigil_node_up and vigil_node_load1: no error, the down node is still found."""
    nodes = [n.id for n in TOPO.nodes]
    values = np.array([[1.0, 0.5]] * len(nodes), dtype=np.float32)
    values[2, 0] = 0.0
    det = RuleDetector(TOPO)
    found = det.update([MetricFrame(0, "node", nodes, ("vigil_node_up", "vigil_node_load1"), values)], [])
    assert [(a.entity, a.fault_type) for a in found] == [(nodes[2], "node_down")]


def test_pcie_width_is_judged_against_the_gpu_own_maximum() -> None:
    """An x8 card reporting a maximum of x8 is healthy; the default width applies only when none is reported."""
    names = ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH")
    values = np.array([[8.0, 8.0]] * len(GPUS), dtype=np.float32)
    values[3] = (4.0, 8.0)
    found = RuleDetector(TOPO).update([MetricFrame(0, "gpu", GPUS, names, values)], [])
    assert [(a.entity, a.fault_type) for a in found] == [(GPUS[3], "gpu_pcie_width_low")]


def test_ipmi_sel_records_are_read_by_sensor_type() -> None:
    det = RuleDetector(TOPO)
    found = det.update([], [
        Event(ts=1, entity="node/n001", kind="ipmi_sel", source="ipmi",
              message="Power Supply #0x51 | Failure detected | Asserted"),
        Event(ts=1, entity="node/n002", kind="ipmi_sel", source="ipmi",
              message="Power Supply #0x51 | Failure detected | Deasserted"),
    ])
    assert [(a.entity, a.fault_type) for a in found] == [("node/n001", "psu_failure")]


def _link_event(ts: float, state: str) -> Event:
    nic = TOPO.nodes[1].nics[3]
    return Event(ts=ts, entity=nic.id, kind="kernel", source="kernel", level=FaultLevel.ISOLATE,
                 message=f"mlx5_core {nic.pci_bus_id} enp12s0np0: Link {state}",
                 attrs={"signature": f"mlx5_link_{state}"})


def test_a_link_that_comes_back_within_the_flap_window_is_a_flap_not_a_dead_link() -> None:
    det = RuleDetector(TOPO)
    found = det.update([], [_link_event(100.0, "down"), _link_event(102.0, "up")])
    found += det.update([], [])
    closed = det.close()
    nic = TOPO.nodes[1].nics[3].id
    assert {(a.entity, a.fault_type) for a in found} == {(nic, "link_flap")}
    assert all(a.fault_type != "link_down" for a in closed)


def test_a_link_that_stays_down_is_a_link_down_after_the_flap_window() -> None:
    det = RuleDetector(TOPO)
    nic = TOPO.nodes[1].nics[3].id
    assert det.update([], [_link_event(100.0, "down")]) == []
    later = det.update([gpu_frame(100.0 + det.t.link_flap_s)], [])
    assert [(a.entity, a.fault_type, a.start) for a in later] == [(nic, "link_down", 100.0)]


def test_without_a_kernel_log_the_xid_comes_from_the_dcgm_gauge() -> None:
    plan = FaultPlan("gpu_gsp_timeout", "gpu/n001/3", start_s=20 * 60, duration_s=10 * 60)
    run = simulate(SimConfig(nodes=2, minutes=40, seed=4, plans=(plan,), benign_noise=False))
    run.logs[:] = [r for r in run.logs if r.source != "kernel"]  # the agent cannot read this node's kernel log

    def gsp_found(xid_from_gpu_gauge: bool) -> bool:
        result = run_pipeline(run, xid_from_gpu_gauge=xid_from_gpu_gauge)
        return any((a.entity, a.fault_type) == (plan.entity, plan.fault_type) for a in result.anomalies)

    assert not gsp_found(False)
    assert gsp_found(True)
    events = run_pipeline(run, xid_from_gpu_gauge=True).events
    assert {(e.entity, e.attrs["xid"], e.source) for e in events if e.kind == "xid"} == {
        ("gpu/n001/3", 119, "dcgm-exporter")}
