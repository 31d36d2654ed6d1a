"""Root cause ranking on hand-made topologies, anomalies, events and logs."""

from __future__ import annotations

import time

import pytest

from vigil.detect.rules import RuleDetector
from vigil.diagnose.hang import HangDiagnosis
from vigil.diagnose.kg import KnowledgeGraph
from vigil.diagnose.rca import analyze_incident, culprits_from_hang
from vigil.model import Anomaly, Event, Evidence, FaultLevel, Incident, LogRecord
from vigil.sources.sim.cluster import build_topology

T0 = 1_767_225_600.0
TIMEOUT = ("[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=18231, "
           "OpType=ALLREDUCE) ran for 600043 milliseconds before timing out.")


@pytest.fixture(scope="module")
def kg() -> KnowledgeGraph:
    # 8 nodes x 8 GPUs, 4 nodes per leaf switch, one 64-rank job on all of them.
    return KnowledgeGraph.build(build_topology(nodes=8, gpus=8, nodes_per_switch=4, job_nodes=8))


def anomaly(entity: str, fault: str, level: FaultLevel = FaultLevel.DRAIN, score: float = 1.0,
            ts: float = T0) -> Anomaly:
    return Anomaly(entity=entity, start=ts, end=ts + 60, detector="rules", fault_type=fault, level=level,
                   score=score, evidence=[Evidence(kind="metric", entity=entity, ts=ts, summary=f"{fault} rule")])


def incident_of(anomalies: list[Anomaly]) -> Incident:
    return Incident(title="test", scope=anomalies[0].entity, entities=sorted({a.entity for a in anomalies}),
                    start=min(a.start for a in anomalies), end=max(a.end for a in anomalies),
                    level=max(a.level for a in anomalies), fault_types=sorted({a.fault_type for a in anomalies}),
                    anomalies=[a.id for a in anomalies])


def timeouts_except(kg: KnowledgeGraph, culprits: set[int], ts: float = T0 + 600) -> list[LogRecord]:
    return [LogRecord(ts=ts, entity=rank, source="rank", line=TIMEOUT)
            for r, rank in enumerate(kg.job_ranks["job/j00"]) if r not in culprits]


def test_several_nodes_under_one_switch_failing_together_point_at_the_switch(kg: KnowledgeGraph) -> None:
    found = [anomaly(f"nic/n00{n}/mlx5_{g}", "link_down", FaultLevel.ISOLATE) for n in range(4) for g in range(8)]
    found.append(anomaly("job/j00", "job_hang"))
    result = analyze_incident(kg, incident_of(found), found)
    assert result.top(1) == [("switch/leaf00", "switch_failure")]
    assert "anomaly:link_down" in result.causes[0].explanation(kg.kb)


def test_one_nic_down_is_the_nic_not_its_switch(kg: KnowledgeGraph) -> None:
    found = [anomaly("nic/n005/mlx5_2", "link_down", FaultLevel.ISOLATE), anomaly("job/j00", "job_hang")]
    result = analyze_incident(kg, incident_of(found), found, logs=timeouts_except(kg, {42}))
    assert result.top(1) == [("nic/n005/mlx5_2", "link_down")]
    assert ("switch/leaf01", "switch_failure") not in result.top(1)


def test_one_rank_hung_with_an_xid_79_is_its_gpu(kg: KnowledgeGraph) -> None:
    found = [anomaly("job/j00", "job_hang")]
    events = [Event(ts=T0 + 5, entity="gpu/n002/3", kind="xid", source="kernel",
                    message="NVRM: Xid (PCI:0000:5d:00): 79, pid=0, name=python, GPU has fallen off the bus.",
                    attrs={"xid": 79})]
    result = analyze_incident(kg, incident_of(found), found, events=events, logs=timeouts_except(kg, {19}))
    assert result.top(1) == [("gpu/n002/3", "gpu_lost")]
    refs = {e.ref for e in result.evidence}
    assert result.causes[0].evidence_refs and set(result.causes[0].evidence_refs) <= refs


def test_one_rank_hung_without_hardware_evidence_is_the_rank(kg: KnowledgeGraph) -> None:
    found = [anomaly("job/j00", "job_hang")]
    result = analyze_incident(kg, incident_of(found), found, logs=timeouts_except(kg, {37}))
    assert result.top(1) == [("job/j00/rank/37", "job_hang")]
    silent = [o for o in result.observations if o.symptom == "peer:silent_rank"]
    assert [o.entity for o in silent] == ["job/j00/rank/37"]


def test_hang_diagnosis_culprit_is_used(kg: KnowledgeGraph) -> None:
    found = [anomaly("job/j00", "job_hang")]
    hang = HangDiagnosis(verdict="hang", culprit_ranks=[11], job="j00", world_size=64)
    culprits = culprits_from_hang(hang)
    assert culprits == {"job/j00/rank/11": 1.0}
    result = analyze_incident(kg, incident_of(found), found, hang_culprits=culprits)
    assert result.top(1) == [("job/j00/rank/11", "job_hang")]
    assert any(o.symptom == "hang" and o.entity == "job/j00/rank/11" for o in result.observations)


def test_unrelated_noise_does_not_move_the_root_cause(kg: KnowledgeGraph) -> None:
    found = [anomaly("gpu/n004/6", "gpu_dbe", FaultLevel.ISOLATE), anomaly("job/j00", "job_crash"),
             anomaly("gpu/n001/2", "gpu_app_error", FaultLevel.OBSERVE, score=0.5),
             anomaly("node/n007", "fan_failure", FaultLevel.DEGRADED, score=0.3)]
    events = [Event(ts=T0, entity="gpu/n004/6", kind="xid", source="kernel", message="NVRM: Xid (PCI:0000:ba:00): "
                    "48, pid=1, name=python, An uncorrectable double bit error (DBE)", attrs={"xid": 48})]
    result = analyze_incident(kg, incident_of(found), found, events=events)
    assert result.top(1) == [("gpu/n004/6", "gpu_dbe")]
    assert abs(sum(c.probability for c in result.causes) - 1.0) < 1e-6


def test_a_fault_on_another_node_of_the_job_is_no_root_without_a_topology_path(kg: KnowledgeGraph) -> None:
    # a thermal incident on one GPU; the job's evidence also holds a link down on another node
    found = [anomaly("gpu/n002/3", "gpu_thermal", FaultLevel.DEGRADED)]
    elsewhere = [anomaly("nic/n006/mlx5_1", "link_down", FaultLevel.ISOLATE)]
    logs = [LogRecord(ts=T0 + 5, entity="node/n006", source="kernel",
                      line="mlx5_core 0000:0c:00.0 enp12s0np0: Link down")]
    result = analyze_incident(kg, incident_of(found), found + elsewhere, logs=logs)
    assert ("gpu/n002/3", "gpu_thermal") in result.top(3)
    # only causes with a path to the GPU: its node's devices, the switches above it - nothing on node n006
    assert all(kg.node_of(entity) in ("node/n002", None) for entity, _ in result.top(10))
    assert all(entity in kg.causes_of("gpu/n002/3") for entity, _ in result.top(10))


def test_a_nic_fault_does_not_explain_the_nic_beside_it(kg: KnowledgeGraph) -> None:
    reach = kg.causes_of("nic/n005/mlx5_2")
    assert "node/n005" in reach and "switch/leaf01" in reach
    assert "nic/n005/mlx5_3" not in reach
    # through the node, a NIC's fault still reaches the ranks it carries
    assert "nic/n005/mlx5_3" in kg.causes_of(kg.job_ranks["job/j00"][42])


def test_two_concurrent_faults_are_the_first_two_causes(kg: KnowledgeGraph) -> None:
    found = [anomaly("nic/n005/mlx5_2", "nic_lost", FaultLevel.ISOLATE),
             anomaly("gpu/n005/3", "gpu_sbe_storm", FaultLevel.DEGRADED), anomaly("job/j00", "job_crash")]
    result = analyze_incident(kg, incident_of(found), found)
    assert set(result.top(2)) == {("nic/n005/mlx5_2", "nic_lost"), ("gpu/n005/3", "gpu_sbe_storm")}


def test_no_evidence_gives_no_ranking_and_says_so(kg: KnowledgeGraph) -> None:
    found = [anomaly("gpu/n001/1", "something_unknown")]
    result = analyze_incident(kg, incident_of(found), found)
    assert result.causes == [] and result.notes


def test_ten_thousand_gpu_topology_ranks_an_incident_within_a_second() -> None:
    big = KnowledgeGraph.build(build_topology(nodes=1250, gpus=8, nodes_per_switch=16, job_nodes=64))
    leaf = "switch/leaf07"
    nodes = sorted(big.nodes_behind(leaf))
    found = [anomaly(f"nic/{n.split('/')[1]}/mlx5_{g}", "link_down", FaultLevel.ISOLATE) for n in nodes
             for g in range(8)]
    job = "job/j01"
    found.append(anomaly(job, "job_hang"))
    # rank 400 runs on a node behind the switch: it saw the IB error, its 511 peers the watchdog timeout
    logs = [LogRecord(ts=T0 + 600, entity=r, source="rank", line=TIMEOUT) for r in big.job_ranks[job] if r !=
            "job/j01/rank/400"]
    logs.append(LogRecord(ts=T0 + 1, entity="job/j01/rank/400", source="rank",
                          line="NCCL WARN NET/IB : Got completion from peer 10.0.3.17<36127> with status=12"))
    incident = incident_of(found)
    big.prepare()  # walk tables are built once per topology
    best = float("inf")
    for _ in range(2):
        started = time.perf_counter()
        result = analyze_incident(big, incident, found, logs=logs)
        best = min(best, time.perf_counter() - started)
    assert result.top(1) == [(leaf, "switch_failure")]
    # target 1 s on an idle machine; the assertion leaves room for a loaded, shared CI box
    assert best < 3.0, f"RCA took {best:.2f} s"


@pytest.mark.parametrize(("exit_code", "exit_reason", "fault"), [
    (-9, "rank 21 killed by signal SIGKILL", "process_killed"),
    (1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "gpu_oom"),
])
def test_a_crashed_rank_is_out_of_memory_only_with_evidence_of_it(kg: KnowledgeGraph, exit_code: int,
                                                                   exit_reason: str, fault: str) -> None:
    """A rank ended by SIGKILL with no CUDA out-of-memory error is a killed process, not gpu_oom: the job event
    as `vigil launch` reports it, through the rules."""
    crash = Event(ts=T0, entity="job/j00", kind="job", source="launch", message=exit_reason, level=FaultLevel.DRAIN,
                  attrs={"reason": "crashed", "verdict": "crash", "rank": 21, "exit_reason": exit_reason,
                         "node": "n002", "exit_code": exit_code})
    found = RuleDetector(build_topology(nodes=8, gpus=8, nodes_per_switch=4, job_nodes=8)).update([], [crash])
    result = analyze_incident(kg, incident_of(found), found, events=[crash])
    assert result.top(1) == [("job/j00/rank/21", fault)]


PEER_CLOSED = ("[rank{r}]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
               "peer [127.0.0.1]:29500")


@pytest.mark.parametrize(("last_line", "fault"), [
    ("[rank21]: ValueError: bad batch at step 15: labels out of range", "application_error"),
    ("[rank21]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "gpu_oom"),
    ("[rank21]: RuntimeError: CUDA error: an illegal memory access was encountered", "gpu_xid"),
    ("[rank21]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
     "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details)",
     "log:nccl_unhandled_system_error"),
])
def test_a_rank_that_raised_is_blamed_on_its_own_code_only_when_no_specific_error_explains_it(
        kg: KnowledgeGraph, last_line: str, fault: str) -> None:
    """The job's own exception on one rank, its peers' "connection closed", the scheduler's FAILED: a plain
    Python error is the application's; a CUDA OOM, CUDA or NCCL error that surfaces as an exception stays with
    its own fault (``log:...``: the fault the knowledge base likes best for that symptom)."""
    ranks = kg.job_ranks["job/j00"]
    logs = [LogRecord(ts=T0, entity=ranks[21], source="rank", line=last_line),
            *(LogRecord(ts=T0 + 1, entity=rank, source="rank", line=PEER_CLOSED.format(r=r))
              for r, rank in enumerate(ranks) if r != 21)]
    failed = Event(ts=T0 + 5, entity="job/j00", kind="job", source="slurm", message="Slurm job j00 FAILED",
                   level=FaultLevel.DRAIN, attrs={"reason": "crashed", "state": "FAILED"})
    found = RuleDetector(build_topology(nodes=8, gpus=8, nodes_per_switch=4, job_nodes=8)).update([], [failed])
    result = analyze_incident(kg, incident_of(found), found, events=[failed], logs=logs)
    if fault.startswith("log:"):
        fault = max(kg.kb.faults_for_symptom(fault).items(), key=lambda item: item[1])[0]
    [(entity, top)] = result.top(1)
    assert top == fault and entity in (ranks[21], "gpu/n002/5"), result.top(3)
