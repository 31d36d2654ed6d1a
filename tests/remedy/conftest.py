"""Fixtures shared by the remedy tests, with the real one-node Slurm cluster's."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from tests.slurm_cluster import on_path as on_path
from tests.slurm_cluster import slurm as slurm

FAKE_SCONTROL = """
import os, sys
state_dir = os.environ["FAKE_SLURM_DIR"]
with open(os.path.join(state_dir, "calls.log"), "a") as log:
    log.write("\\t".join(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
def state_file(node):
    return os.path.join(state_dir, node + ".state")
if args[:2] == ["show", "job"]:
    recorded = os.path.join(state_dir, "job-" + args[2] + ".txt")
    if not os.path.exists(recorded):
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        sys.exit(1)
    print(open(recorded).read().strip())
elif args[:2] == ["show", "hostnames"]:
    for part in args[2].split(","):
        prefix, _, span = part.partition("[")
        if not span:
            print(part)
            continue
        first, _, last = span.rstrip("]").partition("-")
        for number in range(int(first), int(last or first) + 1):
            print(prefix + str(number).zfill(len(first)))
elif args[0] in ("requeue", "requeuehold", "release"):
    pass
elif args[0] == "update" and args[1].startswith("jobid="):
    pass
elif args[:2] == ["show", "node"]:
    node = args[2]
    if node == "ghost":
        print(f"Node {node} not found", file=sys.stderr)
        sys.exit(1)
    recorded = os.path.join(state_dir, "node-" + node + ".txt")
    if os.path.exists(recorded):
        print(open(recorded).read().strip())
        sys.exit(0)
    state = open(state_file(node)).read() if os.path.exists(state_file(node)) else "IDLE"
    print(f"NodeName={node} Arch=x86_64 CoresTotal=64 State={state} Partitions=gpu")
elif args[0] == "update":
    fields = dict(a.split("=", 1) for a in args[1:])
    node = fields["nodename"]
    if node == "ghost":
        print("slurm_update error: Invalid node name specified", file=sys.stderr)
        sys.exit(1)
    new = {"drain": "IDLE+DRAIN", "resume": "IDLE"}[fields["state"]]
    open(state_file(node), "w").write(new)
elif args[0] == "reboot":
    open(state_file(args[-1]), "w").write("IDLE+DRAIN+REBOOT_REQUESTED")
"""


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    # The test interpreter directly, not `env python3`: a version-manager shim costs ~0.3 s per call.
    script.write_text(f"#!{sys.executable} -I{FAKE_SCONTROL}")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_DIR", str(tmp_path))
    return tmp_path


def calls(state_dir: Path) -> list[list[str]]:
    log = state_dir / "calls.log"
    return [line.split("\t") for line in log.read_text().splitlines()] if log.exists() else []
