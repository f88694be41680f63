"""Checkpoints of a training run: atomic, fsynced directories that a later attempt resumes from.

Layout of `RUN_DIR/checkpoints/<step:08d>/`:

- `model.pt`      the model's state dict (the uncompiled module's)
- `optimizer.pt`  optimizer state (moments, step counts, param-group hyper-parameters)
- `scheduler.pt`  learning-rate scheduler state (its step count)
- `scaler.pt`     GradScaler state (fp16 only; absent otherwise)
- `rng.pt`        RNG states: python `random`, numpy's global generator, torch CPU, every CUDA device
- `rng.rank<N>.pt` the same for rank N of a multi-process run (rank 0's is `rng.pt`)
- `meta.json`     step, samples_seen, tokens_seen, the batch shape that wrote it, the reason, etc.

A checkpoint is written into `.tmp-<step>-<pid>/`, every file fsynced, then the directory is
renamed to its final name and the parent fsynced. A directory with a final name therefore is
complete by construction; `meta.json` is written last and checked anyway, so a checkpoint copied
by hand half-way is skipped rather than loaded.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

# The layout is shared with the daemon (which must not import torch); re-exported here for the
# runner's callers.
from gpuwarden.core.checkpoints import META, TMP_PREFIX, checkpoint_name
from gpuwarden.core.checkpoints import find_latest_checkpoint as find_latest_checkpoint
from gpuwarden.core.checkpoints import list_checkpoints as list_checkpoints


@dataclass
class RngState:
    """Every RNG a training step may draw from, captured at an optimizer-step boundary."""

    python: tuple[Any, ...]
    numpy: dict[str, Any]
    torch_cpu: torch.Tensor
    torch_cuda: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def capture(cls) -> RngState:
        """The current state of all generators (CUDA ones only if CUDA was initialised)."""
        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        assert isinstance(keys, np.ndarray)  # legacy=True always gives the MT19937 tuple
        cuda = (
            torch.cuda.get_rng_state_all()
            if torch.cuda.is_available() and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
            else []
        )
        return cls(
            python=random.getstate(),
            # numpy arrays are not loadable with weights_only=True: keep the key as a tensor
            numpy={
                "kind": kind,
                "keys": torch.from_numpy(keys.astype(np.int64)),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached": float(cached),
            },
            torch_cpu=torch.get_rng_state(),
            torch_cuda=list(cuda),
        )

    def restore(self) -> None:
        """Put every generator back into this state."""
        random.setstate(self.python)
        np.random.set_state(
            (
                self.numpy["kind"],
                self.numpy["keys"].numpy().astype(np.uint32),
                self.numpy["pos"],
                self.numpy["has_gauss"],
                self.numpy["cached"],
            )
        )
        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(self.torch_cuda[: torch.cuda.device_count()])

    def to_dict(self) -> dict[str, Any]:
        return {
            "python": self.python,
            "numpy": self.numpy,
            "torch_cpu": self.torch_cpu,
            "torch_cuda": self.torch_cuda,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RngState:
        python = data["python"]
        # random.setstate wants tuples; torch.load may hand back lists
        python_state = (python[0], tuple(python[1]), python[2])
        return cls(python_state, data["numpy"], data["torch_cpu"], list(data.get("torch_cuda", [])))


@dataclass
class CheckpointPayload:
    """What one checkpoint holds. State dicts are taken by the caller at a consistent point."""

    step: int
    samples_seen: int
    model: dict[str, Any]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng: RngState
    scaler: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    rank_rngs: list[RngState] = field(default_factory=list)  # ranks 1… of a multi-process run


def rng_file(rank: int) -> str:
    """The RNG file of `rank` inside a checkpoint."""
    return "rng.pt" if rank == 0 else f"rng.rank{rank}.pt"


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save(obj: Any, path: Path) -> None:
    torch.save(obj, path)
    _fsync_file(path)


def save_checkpoint(root: Path, payload: CheckpointPayload, *, keep: int, reason: str) -> Path:
    """Write `payload` atomically as `root/<step:08d>/` and keep only the newest `keep` checkpoints.

    If a checkpoint for the same step already exists it is replaced (the new one was taken at
    the same optimizer step, so both describe the same training state).
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(payload.step)
    tmp = root / f"{TMP_PREFIX}{payload.step}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        _save(payload.model, tmp / "model.pt")
        _save(payload.optimizer, tmp / "optimizer.pt")
        _save(payload.scheduler, tmp / "scheduler.pt")
        if payload.scaler is not None:
            _save(payload.scaler, tmp / "scaler.pt")
        _save(payload.rng.to_dict(), tmp / rng_file(0))
        for rank, rng in enumerate(payload.rank_rngs, start=1):
            _save(rng.to_dict(), tmp / rng_file(rank))
        meta = {**payload.meta, "step": payload.step, "samples_seen": payload.samples_seen, "reason": reason}
        (tmp / META).write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8")
        _fsync_file(tmp / META)
        _fsync_dir(tmp)
        if final.exists():
            # rename() cannot replace a non-empty directory: move the old one aside first
            old = root / f"{TMP_PREFIX}old-{payload.step}-{os.getpid()}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune_checkpoints(root, keep)
    return final


def prune_checkpoints(root: Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints, and stale temporary directories."""
    for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(f"{TMP_PREFIX}*"):
        # another live process never writes into our run's checkpoints, so leftovers are garbage
        if not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)


@dataclass
class LoadedCheckpoint:
    path: Path
    meta: dict[str, Any]
    model: dict[str, Any]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    scaler: dict[str, Any] | None
    rng: RngState | None  # None: the checkpoint has no RNG state for the rank that loaded it

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    @property
    def samples_seen(self) -> int:
        return int(self.meta["samples_seen"])


def load_checkpoint(path: Path, map_location: torch.device | str = "cpu", rank: int = 0) -> LoadedCheckpoint:
    """Read a checkpoint written by `save_checkpoint` (tensors only: `weights_only=True`), with the
    RNG state of `rank` (None when it was written by fewer processes)."""

    def load(name: str) -> Any:
        return torch.load(path / name, map_location=map_location, weights_only=True)

    meta = json.loads((path / META).read_text(encoding="utf-8"))
    scaler = load("scaler.pt") if (path / "scaler.pt").is_file() else None
    rng_path = path / rng_file(rank)
    rng = (
        RngState.from_dict(torch.load(rng_path, map_location="cpu", weights_only=True))
        if rng_path.is_file()
        else None
    )
    return LoadedCheckpoint(
        path=path,
        meta=meta,
        model=load("model.pt"),
        optimizer=load("optimizer.pt"),
        scheduler=load("scheduler.pt"),
        scaler=scaler,
        rng=rng,
    )
