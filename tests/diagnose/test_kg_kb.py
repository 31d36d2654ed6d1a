"""The versioned fault knowledge base (vigil/knowledge/data/kb/*.yaml): loading, validation, seeding."""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

import pytest

from vigil.diagnose.kb import load_kb, validate_kb
from vigil.knowledge.faults import fault_catalogue
from vigil.knowledge.signatures import signature_library
from vigil.knowledge.xid import known_xids, xid_info
from vigil.model import ActionKind, VigilInputError

KB_DIR = Path(str(resources.files("vigil.knowledge.data").joinpath("kb")))


@pytest.fixture()
def kb_copy(tmp_path: Path) -> Path:
    target = tmp_path / "kb"
    shutil.copytree(KB_DIR, target)
    return target


def test_shipped_kb_is_valid_on_its_own() -> None:
    kb = load_kb()
    assert kb.problems == []
    assert set(kb.faults) == set(fault_catalogue().faults)
    assert validate_kb(kb, expected_faults=["no_such_fault"]) == [
        "faults.yaml: fault type 'no_such_fault' has no knowledge entry"]
    for fault in kb.faults.values():
        assert fault.remedies and all(isinstance(r.action, ActionKind) for r in fault.remedies)
    assert set(kb.action_templates) == set(ActionKind)


def test_likelihoods_and_priors_come_from_the_yaml_and_the_trace() -> None:
    kb = load_kb()
    assert kb.likelihood("xid:79", "gpu_lost") == 1.0
    assert kb.likelihood("xid:79", "switch_failure") == 0.0
    assert kb.likelihood("anomaly:gpu_dbe", "gpu_dbe") == 1.0
    # Xid 46 (RESET_GPU) counts for gpu_xid through the Xid table even where faults.yaml does not list it.
    assert kb.likelihood("xid:46", "gpu_xid") > 0
    # The trace saw 60 DBE faults and one silent data corruption: the priors keep that order.
    assert kb.log_prior("gpu_dbe") > kb.log_prior("gpu_thermal") > kb.log_prior("silent_data_corruption") - 1e-9


def test_kb_reads_the_one_xid_table() -> None:
    kb = load_kb()
    assert sorted(kb.xids) == known_xids()
    assert all(kb.xids[code].fault == xid_info(code).fault for code in known_xids())
    # the disagreements of the old tables, resolved by the NVIDIA catalogue's text
    assert kb.xids[140].fault == "gpu_dbe" and kb.xids[94].fault == "gpu_dbe"
    assert {kb.xids[code].fault for code in range(144, 151)} == {"nvlink_error"}


def test_trace_counts_match_the_real_stepfun_trace(shared_data: Path) -> None:
    stats = json.loads((shared_data / "stepfun_infinitehbd_trace" / "fault_statistics.json").read_text())
    real = {(level, cls, desc): count
            for level, classes in stats.items() for cls, descs in classes.items() if isinstance(descs, dict)
            for desc, count in descs.items() if desc != "ClassTotal"}
    kb = load_kb()
    ours = {(t.level, t.cls, t.desc): t.count for t in kb.trace}
    assert ours == real
    assert sum(ours.values()) == 584


def test_log_signatures_match_real_kernel_lines(shared_data: Path) -> None:
    kb = load_kb()
    gsp = (shared_data / "xid" / "log_samples" / "gpud_testdata_dmesg-with-xid-119.log").read_text().splitlines()
    hits = {s.name for line in gsp for s in kb.match_log(line)}
    assert "gsp_timeout" in hits
    nccl = (shared_data / "xid" / "log_samples" / "gpud_testdata_nccl_dmesg.decode.iso.log").read_text()
    assert {s.symptom for s in kb.match_log(nccl.splitlines()[0])} == {"log:segfault"}
    assert kb.match_log("all good, step 100 loss 2.31") == []


def test_broken_files_raise_one_line_errors_naming_the_file(kb_copy: Path) -> None:
    faults = kb_copy / "faults.yaml"
    faults.write_text(faults.read_text().replace("{action: cordon, target: node", "{action: rm_rf, target: node", 1))
    with pytest.raises(VigilInputError, match=r"faults.yaml.*rm_rf.*whitelist"):
        load_kb(kb_copy)


def test_bad_regex_and_missing_file(kb_copy: Path) -> None:
    sigs = kb_copy / "signatures.yaml"
    sigs.write_text(sigs.read_text().replace("pattern: '(?i)Kernel panic", "pattern: '(?i)(Kernel panic", 1))
    with pytest.raises(VigilInputError, match="kernel_panic.*bad regular expression"):
        load_kb(kb_copy)
    (kb_copy / "signatures.yaml").unlink()
    with pytest.raises(VigilInputError, match="signatures.yaml does not exist"):
        load_kb(kb_copy)


def test_cross_reference_problems_are_listed(kb_copy: Path) -> None:
    faults = kb_copy / "faults.yaml"
    text = faults.read_text().replace(
        "xid:79: 1.0", "xid:99999: 1.0, log:no_such_signature: 0.5, metric:DCGM_FI_NO_SUCH_FIELD: 0.5", 1)
    faults.write_text(text.replace("entity: [switch]", "entity: [toaster]", 1))
    problems = load_kb(kb_copy).problems
    assert any("xid:99999" in p for p in problems)
    assert any("no_such_signature" in p for p in problems)
    assert any("toaster" in p for p in problems)
    assert any("DCGM_FI_NO_SUCH_FIELD" in p for p in problems)


def test_one_signature_library_names_the_symptoms_and_faults() -> None:
    kb = load_kb()
    library = signature_library()
    # each RCA log symptom of faults.yaml is produced by a signature of the one library
    produced = {s.symptom for s in library if s.symptom}
    wanted = {symptom.removeprefix("log:") for fault in kb.faults.values() for symptom in fault.symptoms
              if symptom.startswith("log:")}
    assert wanted <= produced
    catalogue = fault_catalogue()
    assert all(s.fault in catalogue.faults or s.fault in catalogue.findings for s in library if s.fault)
    line = "NCCL WARN NET/IB : Got completion from peer 10.0.3.17<36127> with status=12 opcode=0 len=0"
    assert {s.symptom for s in kb.match_log(line)} == {"log:nccl_ib_error"}


def test_a_signature_outside_the_fault_vocabulary_is_rejected(kb_copy: Path) -> None:
    sigs = kb_copy / "signatures.yaml"
    sigs.write_text(sigs.read_text().replace("fault: gpu_oom", "fault: gpu_out_of_memory", 1))
    with pytest.raises(VigilInputError, match="cuda.oom: fault 'gpu_out_of_memory' is neither"):
        load_kb(kb_copy)
