from __future__ import annotations

import random
import shutil
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch

from vigil.checkpoint.manager import (
    CheckpointManager,
    complete_steps,
    latest_step,
    restore_backup,
    step_dir_name,
)
from vigil.checkpoint.state import ShardedSampler
from vigil.model import VigilInputError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, sampler: ShardedSampler) -> float:
    data = torch.arange(64 * 4, dtype=torch.float32).reshape(64, 4) / 100
    batch = data[sampler.next_batch()] + torch.randn(4) * random.random() + float(np.random.rand())
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def test_restore_gives_identical_continuation(tmp_path: Path) -> None:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    model, optimizer = make()
    sampler = ShardedSampler(64, 8, rank=0, world_size=1, seed=3)
    manager = CheckpointManager(tmp_path, keep_last=2)
    for _ in range(5):
        train_step(model, optimizer, sampler)
    manager.save(5, model, optimizer, {"sampler": sampler.state_dict()})
    # Training keeps mutating the live tensors while the save is in flight: the save must not see it.
    expected = [train_step(model, optimizer, sampler) for _ in range(12)]
    manager.close()

    torch.manual_seed(999)
    random.seed(999)
    np.random.seed(999)
    fresh_model, fresh_optimizer = make()
    fresh_sampler = ShardedSampler(64, 8, rank=0, world_size=1, seed=3)
    restored = CheckpointManager(tmp_path).restore_latest(fresh_model, fresh_optimizer)
    assert restored is not None and restored.step == 5
    fresh_sampler.load_state_dict(restored.extra["sampler"])
    resumed = [train_step(fresh_model, fresh_optimizer, fresh_sampler) for _ in range(12)]
    assert resumed == expected  # bit for bit, across an epoch boundary of the sampler


def test_retention_keeps_last_n_and_ignores_incomplete(tmp_path: Path) -> None:
    model, optimizer = make()
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3, 4):
        manager.save(step, model, optimizer)
    manager.close()
    assert complete_steps(tmp_path) == [3, 4]
    # A save cut short by a crash has shards but no .metadata: never picked as latest.
    partial = tmp_path / step_dir_name(9)
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"partial")
    assert latest_step(tmp_path) == 4


def test_sampled_backups_and_restore_from_backup(tmp_path: Path) -> None:
    model, optimizer = make()
    backup = f"file://{tmp_path / 'remote'}"
    manager = CheckpointManager(tmp_path / "local", keep_last=1, backup_url=backup, backup_every=2)
    for step in range(1, 7):
        manager.save(step, model, optimizer)
    manager.close()
    assert sorted(manager.backed_up) == [2, 4, 6]
    fs, root = fsspec.core.url_to_fs(backup)
    assert sorted(Path(p).name for p in fs.ls(root, detail=False)) == [step_dir_name(s) for s in (2, 4, 6)]
    assert complete_steps(tmp_path / "local") == [6]

    shutil.rmtree(tmp_path / "local")
    restore_backup(backup, 4, tmp_path / "elsewhere")
    target_model, target_optimizer = make()
    restored = CheckpointManager(tmp_path / "elsewhere").restore_latest(target_model, target_optimizer)
    assert restored is not None and restored.step == 4
    for got, want in zip(target_model.parameters(), model.parameters(), strict=True):
        assert torch.equal(got, want)


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    model, optimizer = make()
    with pytest.raises(VigilInputError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=0)
    manager = CheckpointManager(tmp_path)
    assert manager.restore_latest(model, optimizer) is None
    with pytest.raises(VigilInputError, match="missing or incomplete"):
        manager.restore(7, model, optimizer)
    manager.save(1, model, optimizer)
    manager.close()
    (tmp_path / step_dir_name(1) / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(VigilInputError, match="could not be loaded"):
        manager.restore(1, model, optimizer)
    with pytest.raises(VigilInputError, match="no complete backup"):
        restore_backup(f"file://{tmp_path / 'nowhere'}", 1, tmp_path / "x")


def test_sampler_walks_epochs_and_resumes() -> None:
    sampler = ShardedSampler(20, 4, rank=1, world_size=2, seed=1)
    seen = [sampler.next_batch() for _ in range(5)]
    state = sampler.state_dict()
    assert state["epoch"] == 2  # 20 samples hold two global batches of 8 per epoch
    after = [sampler.next_batch() for _ in range(3)]
    twin = ShardedSampler(20, 4, rank=1, world_size=2, seed=1)
    twin.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(after, [twin.next_batch() for _ in range(3)], strict=True))
    assert not torch.equal(seen[0], seen[2])


def test_cli_lists_checkpoints_with_sizes(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from vigil.faces.cli.checkpoint import app

    model, optimizer = make()
    manager = CheckpointManager(tmp_path, keep_last=3)
    for step in (10, 20):
        manager.save(step, model, optimizer)
    manager.close()
    (tmp_path / step_dir_name(30)).mkdir()  # a save cut short
    result = CliRunner().invoke(app, ["ls", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    assert [(e["step"], e["complete"]) for e in listing] == [(10, True), (20, True), (30, False)]
    assert listing[0]["bytes"] > sum(p.numel() * 4 for p in model.parameters())
    missing = CliRunner().invoke(app, ["ls", str(tmp_path / "nope")])
    assert missing.exit_code != 0 and "does not exist" in str(missing.exception)


def test_restoring_rng_state_never_runs_code(tmp_path: Path) -> None:
    import os
    import pickle

    from vigil.checkpoint.state import capture_rng, restore_rng

    marker = tmp_path / "ran"

    class Hostile:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    state = capture_rng()
    restore_rng(state)  # a real capture round-trips
    for part in ("python", "numpy"):
        bad = dict(state, **{part: pickle.dumps(Hostile())})
        with pytest.raises(VigilInputError, match="not a data-only pickle"):
            restore_rng(bad)
    assert not marker.exists()
