"""Flight Recorder dumps of a real gloo run (torch 2.13, TORCH_FR_BUFFER_SIZE): loading and consensus."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from vigil.diagnose.flight_recorder import (
    diagnose_dumps,
    normalize_for_torch,
    read_dir,
    read_dump,
    run_torch_analyzer,
    to_op_records,
)
from vigil.model import VigilInputError

# Rank 1 deadlocked between two of its threads before all_reduce #7; ranks 0 and 2 wait in it.
FIXTURE = Path(__file__).parents[1] / "fixtures" / "hang" / "fr_gloo_deadlock"


@pytest.fixture()
def dumps(tmp_path: Path) -> Path:
    target = tmp_path / "fr"
    shutil.copytree(FIXTURE, target)
    return target


def test_real_gloo_dumps_name_the_rank_that_never_joined(dumps: Path) -> None:
    diagnosis = diagnose_dumps(dumps)
    assert diagnosis.verdict == "hang"
    assert diagnosis.hang_kind == "not_enqueued"
    assert diagnosis.culprit_ranks == [1]
    assert diagnosis.source == "flight_recorder"
    assert "#7" in diagnosis.summary


def test_gloo_quirks_are_handled(dumps: Path) -> None:
    dump = read_dump(dumps / "rank_0")
    assert dump.version == "2.10"
    assert "" in dump.pg_config  # gloo keys the default group by an empty name
    records = to_op_records(dump)
    assert records[-1].group_ranks == [0, 1, 2]
    # States stay "scheduled" in gloo dumps; completion comes from pg_status.
    assert [r.state for r in records][-2:] == ["completed", "scheduled"]


def test_json_dumps_read_the_same(dumps: Path, tmp_path: Path) -> None:
    as_json = tmp_path / "json"
    as_json.mkdir()
    for path in dumps.iterdir():
        data = pickle.loads(path.read_bytes())
        for entry in data["entries"]:
            entry.pop("frames", None)
        (as_json / f"{path.name}.json").write_text(json.dumps(data))
    assert diagnose_dumps(as_json).culprit_ranks == [1]


def test_culprit_rank_zero_is_not_hidden_by_a_reference_rank(dumps: Path) -> None:
    # Make rank 0 the one that never joined #7: consensus, not the first rank, decides.
    seven = next(e for e in pickle.loads((dumps / "rank_0").read_bytes())["entries"] if e["collective_seq_id"] == 7)
    for rank in (0, 1, 2):
        data = pickle.loads((dumps / f"rank_{rank}").read_bytes())
        data["entries"] = [e for e in data["entries"] if e["collective_seq_id"] < 7]
        if rank != 0:
            data["entries"].append(seven)
        else:
            data["pg_status"]["0"].update(last_enqueued_collective=6, last_completed_collective=6)
        (dumps / f"rank_{rank}").write_bytes(pickle.dumps(data))
    assert diagnose_dumps(dumps).culprit_ranks == [0]


def test_a_missing_dump_still_gives_a_verdict(dumps: Path) -> None:
    (dumps / "rank_1").unlink()
    diagnosis = diagnose_dumps(dumps)
    assert diagnosis.culprit_ranks == [1]
    assert any("no FR dump from rank(s) [1]" in e.summary for e in diagnosis.evidence)


@pytest.mark.parametrize("version", ["2.3", "2.7", "2.10"])
def test_supported_versions(dumps: Path, version: str) -> None:
    for path in dumps.iterdir():
        data = pickle.loads(path.read_bytes())
        data["version"] = version
        path.write_bytes(pickle.dumps(data))
    assert diagnose_dumps(dumps).culprit_ranks == [1]


def test_bad_dumps_give_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank_0").write_bytes(b"\x80\x04corrupt")
    with pytest.raises(VigilInputError, match="rank_0 is corrupt"):
        read_dir(bad)
    (bad / "rank_0").write_bytes(pickle.dumps({"version": "1.0", "entries": []}))
    with pytest.raises(VigilInputError, match="version '1.0' is not supported"):
        read_dir(bad)
    (bad / "rank_0").write_bytes(pickle.dumps({"version": "2.10"}))
    with pytest.raises(VigilInputError, match="missing field 'entries'"):
        read_dir(bad)
    with pytest.raises(VigilInputError, match="no Flight Recorder dumps"):
        read_dir(tmp_path / "bad" / "..")


def test_hostile_pickle_is_refused(tmp_path: Path) -> None:
    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("pwned",))

    (tmp_path / "rank_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [Boom()]}))
    with pytest.raises(VigilInputError, match="refusing to load class"):
        read_dump(tmp_path / "rank_0")


@pytest.mark.slow
def test_side_by_side_with_torch_analyzer(dumps: Path, tmp_path: Path) -> None:
    raw = run_torch_analyzer(dumps, "rank_")
    # torch's analyzer looks the group up by the entries' name, which gloo dumps do not use as key.
    assert not raw.ok and "KeyError" in raw.output
    normalized = tmp_path / "normalized"
    normalize_for_torch(dumps, normalized)
    fixed = run_torch_analyzer(normalized, "rank_")
    assert fixed.missing_ranks == [1]
    assert diagnose_dumps(normalized).culprit_ranks == [1]


def test_nccl_style_states_name_the_rank_that_never_started(dumps: Path) -> None:
    # As with TORCH_NCCL_ENABLE_TIMING: every rank enqueued #7, ranks 1 and 2 started it, rank 0 did not.
    seven = next(e for e in pickle.loads((dumps / "rank_0").read_bytes())["entries"] if e["collective_seq_id"] == 7)
    for rank in (0, 1, 2):
        data = pickle.loads((dumps / f"rank_{rank}").read_bytes())
        data["entries"] = [e for e in data["entries"] if e["collective_seq_id"] < 7]
        data["entries"].append({**seven, "state": "scheduled" if rank == 0 else "started",
                                "time_discovered_started_ns": None if rank == 0 else seven["time_created_ns"] + 1000})
        data["pg_status"]["0"].update(last_enqueued_collective=7, last_completed_collective=6)
        (dumps / f"rank_{rank}").write_bytes(pickle.dumps(data))
    diagnosis = diagnose_dumps(dumps)
    assert (diagnosis.verdict, diagnosis.hang_kind, diagnosis.culprit_ranks) == ("hang", "stuck_in_collective", [0])
    assert "never started it" in diagnosis.summary
