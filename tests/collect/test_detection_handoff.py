"""What the agent reads feeds the rule detector as is: real kernel captures become anomalies."""

from __future__ import annotations

from pathlib import Path

from vigil.detect.rules import RuleDetector
from vigil.model import FaultLevel
from vigil.sources.collect.kmsg import KernelLogSource
from vigil.sources.sim.cluster import build_topology


def test_kernel_events_become_rule_anomalies(shared_data: Path, tmp_path: Path) -> None:
    topology = build_topology(nodes=1, gpus=8)
    node = topology.nodes[0]
    capture = (shared_data / "xid" / "log_samples" / "gpud_testdata_dmesg-with-xid-119.log").read_text()
    log = tmp_path / "kern.log"
    log.write_text(capture + "[ 9.0] mce: [Hardware Error]: CPU 12: Machine Check Exception: 5 Bank 7: "
                   "be00000000800400\n[ 9.1] mce: [Hardware Error]: Machine check events logged\n")
    # the capture names its GPU by PCI bus id only; say it is GPU 4 of this node, as NVML would
    kernel = KernelLogSource.from_file(log, node=node.name, gpu_index={"0000:9b:00": 4}.get, boot_time=0.0)
    events = kernel.collect(2e9).events
    anomalies = RuleDetector(topology).update([], events)
    found = {(a.entity, a.fault_type, a.level) for a in anomalies}
    assert (f"gpu/{node.name}/4", "gpu_gsp_timeout", FaultLevel.DRAIN) in found
    assert (f"node/{node.name}", "cpu_mce", FaultLevel.DRAIN) in found
