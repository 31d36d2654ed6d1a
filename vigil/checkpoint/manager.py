"""Continuous asynchronous checkpoints on torch.distributed.checkpoint, with retention and backups.

Layout: ``<directory>/step-<NNNNNNNNN>/`` holds one DCP checkpoint. DCP's coordinator writes
``.metadata`` only after every rank has written its shards, so a step directory with ``.metadata`` is
complete; a directory without one is a save that was cut short (a crash mid-write) and is ignored.
"""

from __future__ import annotations

import logging
import pickle
import re
import shutil
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from vigil.checkpoint.state import capture_rng, rank_key, restore_rng
from vigil.model import VigilInputError
from vigil.store.safe_pickle import load_data

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d{9})$")
_METADATA = ".metadata"


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


def complete_steps(directory: Path) -> list[int]:
    """Steps with a complete checkpoint under ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    steps = []
    for child in directory.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / _METADATA).is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def describe_checkpoints(directory: Path) -> list[dict[str, int | float | bool]]:
    """Every step directory, oldest first: complete or not, bytes on disk, file count, newest mtime."""
    entries: list[dict[str, int | float | bool]] = []
    for child in sorted(directory.iterdir()):
        match = _STEP_DIR.match(child.name)
        if not match or not child.is_dir():
            continue
        files = [f for f in child.iterdir() if f.is_file()]
        entries.append(
            {
                "step": int(match.group(1)),
                "complete": (child / _METADATA).is_file(),
                "bytes": sum(f.stat().st_size for f in files),
                "files": len(files),
                "mtime": max((f.stat().st_mtime for f in files), default=child.stat().st_mtime),
            }
        )
    return entries


def latest_step(directory: Path) -> int | None:
    steps = complete_steps(directory)
    return steps[-1] if steps else None


@dataclass
class RestoredState:
    step: int
    extra: dict[str, Any]


class CheckpointManager:
    """Saves model + optimizer + per-rank RNG + data position every call, without stalling training.

    ``save`` stages a copy of the state (so training may mutate the live tensors straight away) and
    writes it on a background thread over a dedicated gloo group, so checkpoint collectives never
    interleave with the training group's collectives. One save is in flight at a time: the next
    ``save`` first waits for the previous one, which bounds memory to one staged copy.

    Rank 0 applies retention (keep the newest ``keep_last`` complete checkpoints) and copies every
    ``backup_every``-th checkpoint to ``backup_url`` (any fsspec URL: file://, s3://, memory://).
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        keep_last: int = 3,
        backup_url: str | None = None,
        backup_every: int = 0,
        async_save: bool = True,
    ) -> None:
        if keep_last < 1:
            raise VigilInputError(f"keep_last must be at least 1, got {keep_last}")
        if backup_every < 0:
            raise VigilInputError(f"backup_every must be 0 (off) or positive, got {backup_every}")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.backup_url = backup_url.rstrip("/") if backup_url else None
        self.backup_every = backup_every
        self.async_save = async_save
        self._distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self._distributed else 0
        self._group = dist.new_group(backend="gloo") if self._distributed else None
        self._pending: Future[Any] | None = None
        self._pending_step: int | None = None
        self._saves = 0
        self._backup_threads: list[threading.Thread] = []
        self.backed_up: list[int] = []
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ save

    def state_dict(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, extra: dict[str, Any]
    ) -> dict[str, Any]:
        model_state, optim_state = get_state_dict(model, optimizer)
        return {
            "model": model_state,
            "optim": optim_state,
            "step": step,
            # Pickled as one blob: DCP loads only the keys a placeholder already has, and the shape
            # of ``extra`` is the caller's business.
            rank_key(self.rank): {"rng": capture_rng(), "extra": pickle.dumps(extra)},
        }

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Checkpoint ``step``; ``extra`` is this rank's resumable data (e.g. the sampler position)."""
        self.wait()
        state = self.state_dict(model, optimizer, step, extra or {})
        checkpoint_id = self.directory / step_dir_name(step)
        if self.async_save:
            pending = dcp.async_save(state, checkpoint_id=checkpoint_id, process_group=self._group)
            # With the default stager the save is staged on return and a plain Future comes back.
            self._pending = pending.upload_completion if isinstance(pending, AsyncSaveResponse) else pending
            self._pending_step = step
        else:
            dcp.save(state, checkpoint_id=checkpoint_id, process_group=self._group)
            self._finished(step)

    def wait(self) -> None:
        """Block until the save in flight (if any) is durable, then apply retention and backup."""
        if self._pending is None:
            return
        pending, step = self._pending, self._pending_step
        self._pending = None
        self._pending_step = None
        pending.result()
        assert step is not None
        self._finished(step)

    def _finished(self, step: int) -> None:
        self._saves += 1
        if self.rank != 0:
            return
        if self.backup_url and self.backup_every and self._saves % self.backup_every == 0:
            thread = threading.Thread(target=self._backup, args=(step,), name=f"ckpt-backup-{step}")
            thread.start()
            self._backup_threads.append(thread)
        self._apply_retention()

    def _apply_retention(self) -> None:
        steps = complete_steps(self.directory)
        backing_up = {int(t.name.rsplit("-", 1)[1]) for t in self._backup_threads if t.is_alive()}
        for old in steps[: -self.keep_last]:
            if old not in backing_up:
                shutil.rmtree(self.directory / step_dir_name(old), ignore_errors=True)

    def _backup(self, step: int) -> None:
        assert self.backup_url is not None
        source = self.directory / step_dir_name(step)
        fs, root = fsspec.core.url_to_fs(self.backup_url)
        target = f"{root}/{step_dir_name(step)}"
        try:
            fs.makedirs(target, exist_ok=True)
            # .metadata last, so a half-copied backup is never mistaken for a complete one.
            files = sorted(source.iterdir(), key=lambda p: p.name == _METADATA)
            for file in files:
                fs.put_file(str(file), f"{target}/{file.name}")
            self.backed_up.append(step)
        except OSError as err:
            log.warning("checkpoint backup of step %d to %s failed: %s", step, self.backup_url, err)

    def close(self) -> None:
        """Finish the save in flight and any backups; call before the process exits."""
        self.wait()
        for thread in self._backup_threads:
            thread.join()
        self._backup_threads.clear()

    # ------------------------------------------------------------------ restore

    def restore_latest(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> RestoredState | None:
        """Load the newest complete checkpoint into model, optimizer and RNG; None when there is none.

        Every rank must agree on the step, so rank 0 picks it and broadcasts it.
        """
        step = latest_step(self.directory) if self.rank == 0 else None
        if self._distributed:
            box = [step]
            dist.broadcast_object_list(box, src=0, group=self._group)
            step = box[0]
        if step is None:
            return None
        return self.restore(step, model, optimizer)

    def restore(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> RestoredState:
        checkpoint_id = self.directory / step_dir_name(step)
        if not (checkpoint_id / _METADATA).is_file():
            raise VigilInputError(f"checkpoint {checkpoint_id} is missing or incomplete (no {_METADATA})")
        # Placeholders shaped like the live state: DCP loads in place into what it is given.
        state = self.state_dict(model, optimizer, step, {})
        try:
            dcp.load(state, checkpoint_id=checkpoint_id, process_group=self._group)
        except (Exception, CheckpointException) as err:  # CheckpointException is a BaseException
            detail = str(err).strip().splitlines()[-1][:300] if str(err).strip() else type(err).__name__
            raise VigilInputError(f"checkpoint {checkpoint_id} could not be loaded: {detail}") from None
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        own = state[rank_key(self.rank)]
        restore_rng(own["rng"])
        extra = load_data(bytes(own["extra"]), f"checkpoint step {step} rank {self.rank} extra state")
        if not isinstance(extra, dict):
            raise VigilInputError(f"checkpoint step {step}: rank {self.rank}'s extra state is not a mapping")
        return RestoredState(step=int(state["step"]), extra=extra)


def restore_backup(backup_url: str, step: int, directory: str | Path) -> Path:
    """Copy backed-up checkpoint ``step`` from ``backup_url`` into ``directory`` (e.g. on a new cluster)."""
    fs, root = fsspec.core.url_to_fs(backup_url.rstrip("/"))
    source = f"{root}/{step_dir_name(step)}"
    if not fs.exists(f"{source}/{_METADATA}"):
        raise VigilInputError(f"no complete backup of step {step} at {backup_url}")
    target = Path(directory) / step_dir_name(step)
    target.mkdir(parents=True, exist_ok=True)
    for entry in fs.ls(source, detail=False):
        name = str(entry).rstrip("/").rsplit("/", 1)[-1]
        fs.get_file(entry, str(target / name))
    return target
