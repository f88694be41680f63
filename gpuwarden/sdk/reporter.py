"""Events from a user's script to the daemon: one JSON line each in the attempt's events.jsonl.

The daemon puts the file's path in `GPUWARDEN_EVENTS_FILE`; without it (the script runs on its
own) every call does nothing. Lines follow docs/events.md; they are written here with `json`
alone, so a script pays no import cost beyond the standard library for reporting.

Under torchrun (`command.launcher: torchrun`: RANK and WORLD_SIZE > 1 in the environment) every
event carries `rank`, and rank N > 0 writes `events.rank<N>.jsonl` beside the attempt's file, the
layout of `gpuwarden.core.gang.files` (not imported: the SDK stays light): one writer per file.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Iterable
from typing import IO, Any

from gpuwarden.sdk.fixed_memory import measure
from gpuwarden.sdk.proc_status import status_bytes

ENV_EVENTS_FILE = "GPUWARDEN_EVENTS_FILE"
ENV_RESUME_FROM = "GPUWARDEN_RESUME_FROM"
PROTOCOL_VERSION = 1


def memory() -> dict[str, int]:
    """Memory figures for a progress event: from torch's CUDA allocator when the script uses
    CUDA (read only if torch is already imported: never imported here), else the process's
    peak resident set and address space."""
    out: dict[str, int] = {}
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available() and cuda.is_initialized():
        stats = cuda.memory_stats()
        out["mem_allocated"] = int(stats.get("allocated_bytes.all.current", 0))
        out["mem_reserved"] = int(stats.get("reserved_bytes.all.current", 0))
        out["mem_peak"] = int(stats.get("allocated_bytes.all.peak", 0))
        out["num_alloc_retries"] = int(stats.get("num_alloc_retries", 0))
        return out
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out["mem_peak"] = int(peak_rss if sys.platform == "darwin" else peak_rss * 1024)
    vm = status_bytes("VmPeak")
    if vm is not None:
        out["vm_peak"] = vm
    return out


def torchrun_rank() -> int | None:
    """This process's rank in a multi-process run started by torchrun, else None."""
    rank, world = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    if rank.isdigit() and world.isdigit() and int(world) > 1:
        return int(rank)
    return None


def rank_path(path: str, rank: int | None) -> str:
    """Where `rank` writes the events of the attempt whose file is `path`."""
    if not rank:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext}"


class Reporter:
    """Writes protocol events to the attempt's events file, or nowhere outside gpuwarden."""

    def __init__(self, path: str | None = None) -> None:
        self.rank = torchrun_rank()
        given = path if path is not None else os.environ.get(ENV_EVENTS_FILE) or None
        self.path = rank_path(given, self.rank) if given is not None else None
        self._fh: IO[str] | None = None
        self._warned = False
        self._resumed: set[str] = set()

    @property
    def active(self) -> bool:
        """Whether the script runs under gpuwarden (events go somewhere)."""
        return self.path is not None

    def emit(self, type_: str, **fields: Any) -> None:
        """One event line, flushed at once; I/O errors are reported once and never raised."""
        if self.path is None:
            return
        event: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": type_, "ts": time.time()}
        if self.rank is not None:
            event["rank"] = self.rank
        event.update({k: v for k, v in fields.items() if v is not None})
        try:
            if self._fh is None:
                # Append: lines of the attempt written before (by another reporter) stay.
                self._fh = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
            self._fh.write(json.dumps(event, separators=(",", ":"), default=str) + "\n")
            self._fh.flush()
        except OSError as exc:
            if not self._warned:
                self._warned = True
                print(f"gpuwarden: cannot write events to {self.path}: {exc}", file=sys.stderr, flush=True)

    def sync(self) -> None:
        """Force written events to disk (before exiting with a status the daemon acts on)."""
        if self._fh is not None:
            try:
                self._fh.flush()
                os.fsync(self._fh.fileno())
            except OSError:
                pass

    # -- the events a training script sends -----------------------------------------------------

    def progress(
        self,
        step: int,
        samples_seen: int,
        *,
        loss: float | None = None,
        batch_size: int | None = None,
        tokens_seen: int | None = None,
        lr: float | None = None,
        samples_per_s: float | None = None,
        tokens_per_s: float | None = None,
        total: int | None = None,
    ) -> None:
        """Optimizer steps done, samples seen; memory is read here. `batch_size` is the
        micro-batch (with it the daemon's memory model learns what fits)."""
        if not self.active:
            return
        self.emit(
            "progress",
            step=step,
            samples_seen=samples_seen,
            loss=loss,
            batch_size=batch_size,
            tokens_seen=tokens_seen,
            lr=lr,
            samples_per_s=samples_per_s,
            tokens_per_s=tokens_per_s,
            total=total,
            **memory(),
        )

    def checkpoint(self, path: str, step: int, samples_seen: int, reason: str = "interval") -> None:
        """A checkpoint is complete: the next attempt may resume from `path`."""
        self.emit(
            "checkpoint", path=os.path.abspath(path), step=step, samples_seen=samples_seen, reason=reason
        )

    def fixed_memory(self, model: Any, optimizers: Iterable[Any] = ()) -> None:
        """What the model holds whatever the micro-batch (weights, and the gradients and
        optimizer state to come): with it the daemon knows when no micro-batch can fit."""
        if not self.active:
            return
        measured = measure(model, optimizers)
        if measured is not None:
            self.emit("fixed_memory", **measured.event_fields())

    def finished(self, **report: Any) -> None:
        self.emit("finished", report=report)

    def resumed(self, path: str) -> None:
        """The program takes `path` to resume from: a `started` event with `resumed_from`, once
        per path (the daemon then says the attempt resumed, whatever its command passed)."""
        if path in self._resumed:
            return
        self._resumed.add(path)
        self.emit("started", resumed_from=path, pid=os.getpid())


_default: Reporter | None = None


def default_reporter() -> Reporter:
    """The process's reporter (created on first use, from the environment)."""
    global _default
    if _default is None:
        _default = Reporter()
    return _default


def resume_from() -> str | None:
    """The checkpoint this attempt should resume from, or None (a first attempt, or outside
    gpuwarden). The same path `{resume_from}` puts in argv. Asking for it tells gpuwarden that the
    attempt resumes from it: a command that passes `{resume_from}` nowhere is otherwise said to
    start from the beginning."""
    path = os.environ.get(ENV_RESUME_FROM) or None
    if path is not None:
        default_reporter().resumed(path)
    return path
