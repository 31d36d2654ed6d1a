"""Property-based fuzzing of every parser and every file a command reads, and of the command line's option types.

Invariant: a correct answer, or VigilInputError (one line; exit status 2 on the command line); never another
exception, and nothing stored changes. Example counts are modest so the suite stays fast; the counts per
target are in docs/benchmarks.md ("Fuzzing").
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vigil.model import VigilInputError

# VIGIL_FUZZ_SCALE=10 runs ten times as many examples (the longer run recorded in docs/benchmarks.md).
SCALE = int(os.environ.get("VIGIL_FUZZ_SCALE", "1"))
FEW = settings(max_examples=40 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOME = settings(max_examples=80 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# JSON-like values, the shape of anything a text file can hold.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
# Text with the characters parsers trip on: controls, quotes, braces, separators, non-ASCII.
nasty_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=300)


@contextmanager
def scratch() -> Iterator[Path]:
    """A fresh directory per example (Hypothesis runs many examples inside one test call)."""
    path = Path(tempfile.mkdtemp(prefix="vigil-fuzz-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def answers_or_refuses(fn: Callable[[], Any]) -> Any:
    """The invariant: a result, or one VigilInputError whose message is one line."""
    try:
        return fn()
    except VigilInputError as err:
        assert "\n" not in str(err).strip(), str(err)
        return None


def mutations(seed: bytes) -> st.SearchStrategy[bytes]:
    """A real file cut short, with bytes flipped, or with garbage spliced in: near misses find more than noise."""
    return st.one_of(
        st.integers(0, len(seed)).map(lambda n: seed[:n]),
        st.tuples(st.integers(0, max(len(seed) - 1, 0)), st.integers(0, 255)).map(
            lambda p: seed[: p[0]] + bytes([p[1]]) + seed[p[0] + 1:]),
        st.tuples(st.integers(0, len(seed)), st.binary(max_size=40)).map(lambda p: seed[: p[0]] + p[1] + seed[p[0]:]),
        st.binary(max_size=200),
    )


# ----------------------------------------------------------------------------- job evidence


@SOME
@given(st.one_of(st.binary(max_size=300), json_values.map(lambda v: pickle.dumps(v, protocol=4)),
                 json_values.map(lambda v: json.dumps(v).encode())))
def test_flight_recorder_dump(raw: bytes) -> None:
    from vigil.diagnose.flight_recorder import read_dump

    with scratch() as tmp:
        (tmp / "rank_0").write_bytes(raw)
        answers_or_refuses(lambda: read_dump(tmp / "rank_0"))


@SOME
@given(json_values)
def test_run_record_snapshot(value: Any) -> None:
    from vigil.diagnose.hang_source import diagnose_path

    with scratch() as tmp:
        (tmp / "rank0.json").write_text(json.dumps(value))
        answers_or_refuses(lambda: diagnose_path(tmp))


@FEW
@given(mutations((FIXTURES / "serve" / "launch_p2p" / "diagnosis.json").read_bytes()))
def test_hang_report(raw: bytes) -> None:
    from vigil.faces.api.hang import load_hang_report

    with scratch() as tmp:
        (tmp / "diagnosis.json").write_bytes(raw)
        answers_or_refuses(lambda: load_hang_report(tmp))


# ----------------------------------------------------------------------------- node sources


EXPOSITION = (
    '# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n'
    'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",Hostname="n1"} 41\n'
)


@SOME
@given(st.one_of(nasty_text, mutations(EXPOSITION.encode()).map(lambda b: b.decode("utf-8", "replace"))))
def test_exposition_page(page: str) -> None:
    from vigil.sources.collect.dcgm import DcgmExporterScraper

    out = DcgmExporterScraper(url="http://127.0.0.1:1/metrics", node="n1").parse_page(page)
    assert all(p.metric for p in out.points)


@SOME
@given(st.one_of(nasty_text, st.builds(lambda pre, tail: f"{pre}NVRM: Xid (PCI:0000:3b:00): {tail}",
                                        nasty_text, nasty_text)))
def test_kernel_line(line: str) -> None:
    from vigil.sources.collect.kmsg import KernelLogSource

    source = KernelLogSource(lambda: [], origin="fuzz", node="n1")
    source.decode(line, 0.0)  # "never raises on a strange line"


@FEW
@given(st.lists(nasty_text, min_size=1, max_size=8))
def test_rank_logs_triage(lines: list[str]) -> None:
    from vigil.logs.triage import triage

    with scratch() as tmp:
        (tmp / "rank0.log").write_text("\n".join(lines))
        (tmp / "rank1.log").write_text("RuntimeError: NCCL communicator was aborted\n")
        answers_or_refuses(lambda: triage(tmp, job="j", workers=1))


@FEW
@given(st.binary(max_size=300))
def test_tensorboard_event_file(raw: bytes) -> None:
    from vigil.logs.scalars import check_event_dir

    with scratch() as tmp:
        (tmp / "events.out.tfevents.1.host").write_bytes(raw)
        answers_or_refuses(lambda: check_event_dir(tmp))


# ----------------------------------------------------------------------------- specs, policies, KB, configs


def _yaml_of(value: Any) -> str:
    return yaml.safe_dump(value)


yaml_texts = st.one_of(json_values.map(_yaml_of), nasty_text)


@SOME
@given(st.one_of(yaml_texts, st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({"name": st.text(max_size=10)}),
    "spec": st.fixed_dictionaries({"replicas": st.integers(-2, 9), "command": st.lists(st.text(max_size=5))}),
}).map(_yaml_of)))
def test_training_job_spec(text: str) -> None:
    from vigil.remedy.jobspec import load_jobspec

    with scratch() as tmp:
        (tmp / "job.yaml").write_text(text)
        answers_or_refuses(lambda: load_jobspec(tmp / "job.yaml"))


@SOME
@given(yaml_texts)
def test_policy_file(text: str) -> None:
    from vigil.remedy.policy import load_policies

    with scratch() as tmp:
        (tmp / "policies.yaml").write_text(text)
        answers_or_refuses(lambda: load_policies(tmp / "policies.yaml"))


@FEW
@given(st.sampled_from(["faults.yaml", "signatures.yaml", "actions.yaml", "trace.yaml"]), yaml_texts)
def test_knowledge_base(name: str, text: str) -> None:
    from vigil.diagnose.kb import kb_dir, load_kb

    with scratch() as tmp:
        shutil.copytree(kb_dir(), tmp / "kb")
        (tmp / "kb" / name).write_text(text)
        answers_or_refuses(lambda: load_kb(tmp / "kb"))


@SOME
@given(yaml_texts)
def test_config_file(text: str) -> None:
    from vigil.config import load_settings

    with scratch() as tmp:
        (tmp / "vigil.yaml").write_text(text)
        answers_or_refuses(lambda: load_settings(tmp / "vigil.yaml"))


@SOME
@given(yaml_texts)
def test_users_file(text: str) -> None:
    from vigil.faces.api.auth import load_users

    with scratch() as tmp:
        (tmp / "users.yaml").write_text(text)
        answers_or_refuses(lambda: load_users(tmp / "users.yaml"))


@SOME
@given(st.one_of(json_values.map(json.dumps), nasty_text))
def test_records_from_json(text: str) -> None:
    from vigil.model import Anomaly, Incident, Topology

    for record in (Anomaly, Incident, Topology):
        answers_or_refuses(lambda record=record: record.from_json(text))  # type: ignore[misc]


# ----------------------------------------------------------------------------- stores and data sets


@FEW
@given(st.binary(min_size=1, max_size=2000))
def test_store_file_is_refused_and_left_as_it_was(raw: bytes) -> None:
    from vigil.remedy.audit import AuditLog
    from vigil.store.sql import Store

    with scratch() as tmp:
        db = tmp / "vigil.db"
        db.write_bytes(raw)
        answers_or_refuses(lambda: Store(f"sqlite:///{db}").incidents())
        answers_or_refuses(lambda: AuditLog(f"sqlite:///{db}").actions())
        # SQLite may add a journal beside it, but the bytes a user had are never rewritten by a failed open.
        assert db.read_bytes()[: len(raw)] == raw or db.read_bytes()[:16] == b"SQLite format 3\x00"


@FEW
@given(st.one_of(st.binary(max_size=300), json_values.map(lambda v: pickle.dumps(v, protocol=4))))
def test_asd_data_set(raw: bytes) -> None:
    from vigil_eval.datasets import load_asd

    with scratch() as tmp:
        processed = tmp / "processed"
        processed.mkdir()
        for part in ("test", "test_label"):
            (processed / f"omi-1_{part}.pkl").write_bytes(raw)
        answers_or_refuses(lambda: load_asd(tmp))


@FEW
@given(st.lists(st.tuples(nasty_text, nasty_text), max_size=6))
def test_nab_data_set(rows: list[tuple[str, str]]) -> None:
    from vigil_eval.datasets import load_nab

    with scratch() as tmp:
        (tmp / "data" / "realKnownCause").mkdir(parents=True)
        (tmp / "labels").mkdir()
        body = "timestamp,value\n" + "".join(f"{a},{b}\n" for a, b in rows)
        (tmp / "data" / "realKnownCause" / "x.csv").write_text(body)
        (tmp / "labels" / "combined_windows.json").write_text('{"realKnownCause/x.csv": []}')
        answers_or_refuses(lambda: load_nab(tmp))


# ----------------------------------------------------------------------------- command-line option types


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Callable[[list[str]], tuple[int, str]]:
    """Run `vigil ARGS` in this process against a home that a fuzzed command must not change."""
    from vigil.config import settings as vigil_settings
    from vigil.faces.cli.main import main

    home = tmp_path_factory.mktemp("home")

    def run(args: list[str]) -> tuple[int, str]:
        import io
        from contextlib import redirect_stderr, redirect_stdout

        patch = pytest.MonkeyPatch()
        patch.setenv("VIGIL_HOME", str(home))
        patch.setattr(sys, "argv", ["vigil", *args])
        vigil_settings.cache_clear()
        err = io.StringIO()
        try:
            with redirect_stdout(io.StringIO()), redirect_stderr(err):
                main()
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
        finally:
            patch.undo()
            vigil_settings.cache_clear()
        assert not any(home.iterdir()), f"vigil {args} wrote into the home"
        return code, err.getvalue()

    return run


numbers = st.one_of(st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e400", "", "x", "0x10", "99999999999"]),
                    st.floats().map(str), st.integers().map(str))


@SOME
@given(st.sampled_from([
    ["incidents", "--limit"], ["incidents", "--status"], ["nodes", "--unhealthy", "--json", "--limit"],
    ["demo", "--nodes", "0", "--minutes"], ["demo", "--minutes", "nan", "--nodes"],
    ["sim", "--out", "/dev/null/x", "--minutes"],
    ["launch", "script", "missing.py", "--hang-timeout"], ["launch", "script", "missing.py", "--nproc-per-node"],
    ["remedy", "audit", "--limit"], ["remedy", "act", "cordon"], ["diagnose", "incident"], ["users", "list", "--file"],
]), numbers)
def test_cli_option_values(cli: Callable[[list[str]], tuple[int, str]], command: list[str], value: str) -> None:
    code, err = cli([*command, value])
    assert code in (0, 2), (command, value, code, err)
    assert "Traceback" not in err
    if code == 2:
        assert len([line for line in err.splitlines() if line.strip()]) == 1, err
