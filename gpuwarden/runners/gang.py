"""The ranks of a multi-process run: who we are, the process group, and what ranks agree on.

A runner started by `torch.distributed.run` finds RANK, WORLD_SIZE and LOCAL_RANK in its
environment; `open_gang` then joins the process group (NCCL on GPUs, gloo on the CPU). A runner
started alone gets a plain `Gang` of one, whose methods are the one-process answers, so the
training loop has a single code path.

Besides the gradients (DDP's all-reduce in the backward pass), ranks exchange two small things
on every step over a CPU (gloo) group, so nothing here synchronises a GPU stream:
- the step's loss units (label tokens) summed over the gang — every rank divides its loss by the
  gang's total, so the averaged gradient equals one process's over the same samples;
- the stop flag (SIGTERM reaches ranks at slightly different moments): all ranks stop at the same
  step boundary, or none does. A rank that stopped alone would leave the others waiting in a
  collective.

A rank whose peer died sees a collective fail (gloo: at once, "Connection reset by peer"; NCCL:
after `collective_timeout`); `is_peer_failure` tells that apart from its own errors.
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gpuwarden.core.errors import UserError
from gpuwarden.core.events import EXIT_GANG_ABORTED, Error
from gpuwarden.runners.events import EventWriter
from gpuwarden.runners.rank_env import RankEnv

# Messages of collectives that failed because another rank went away (gloo raises a plain
# RuntimeError naming its transport; NCCL a DistBackendError).
_PEER_FAILURE_MARKERS = ("/gloo/", "Connection reset by peer", "Connection closed by peer", "NCCL")


def is_peer_failure(exc: BaseException) -> bool:
    """Whether `exc` is a collective that failed because another rank is gone or stuck."""
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(marker in text for marker in _PEER_FAILURE_MARKERS)


def report_peer_lost(events: EventWriter, rank: int, exc: BaseException, where: str) -> int:
    """Another rank is gone (a collective failed): an `error` event (gang_aborted), no checkpoint."""
    detail = " ".join(str(exc).split())[:300]
    message = (
        f"rank {rank} stopped {where}: another rank of the gang stopped first — see its events; "
        f"the gang resumes from the last complete checkpoint ({detail})"
    )
    events.emit(Error(code="gang_aborted", message=message))
    print(f"gpuwarden: {message}", file=sys.stderr, flush=True)
    return EXIT_GANG_ABORTED


class Gang:
    """The ranks of a run; this base class is a run of one process, where every exchange is the
    identity (ProcessGang is the distributed one)."""

    rank = 0
    local_rank = 0
    world_size = 1

    @property
    def distributed(self) -> bool:
        return False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def no_sync(self, model: nn.Module, sync: bool) -> AbstractContextManager[None]:
        return nullcontext()

    def sum_counts(self, counts: list[int]) -> list[int]:
        """Host-side counts (loss units, samples, a stop flag…) summed over the ranks."""
        return counts

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """`value` summed over the ranks."""
        return value

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj` on rank 0 (others get an empty list)."""
        return [obj]

    def close(self) -> None:
        """Leave the process group (after a clean end only)."""


class ProcessGang(Gang):
    """A rank of a torchrun gang with an initialised default process group."""

    def __init__(self, env: RankEnv, device: torch.device, timeout_s: int) -> None:
        self.rank = env.rank
        self.local_rank = env.local_rank
        self.world_size = env.world_size
        timeout = timedelta(seconds=timeout_s)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timeout, device_id=device if device.type == "cuda" else None)
        # small host-side exchanges go over gloo so they never wait for a GPU stream
        self.control = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None
        self.device = device

    @property
    def distributed(self) -> bool:
        return True

    def wrap(self, model: nn.Module) -> nn.Module:
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)

    def no_sync(self, model: nn.Module, sync: bool) -> AbstractContextManager[None]:
        # accumulation micro-batches keep their gradients local; the last one all-reduces
        if sync or not isinstance(model, DistributedDataParallel):
            return nullcontext()
        return model.no_sync()

    def sum_counts(self, counts: list[int]) -> list[int]:
        values = torch.tensor(counts, dtype=torch.int64)
        dist.all_reduce(values, group=self.control)
        return [int(v) for v in values]

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        out = value.clone()
        dist.all_reduce(out)
        return out

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.control)
        return out or []

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def rank_device(device: torch.device, env: RankEnv | None) -> torch.device:
    """Rank N of a gang on GPUs uses the N-th visible GPU (the daemon lists the gang's GPUs)."""
    if env is None or device.type != "cuda":
        return device
    if env.local_rank >= torch.cuda.device_count():
        raise UserError(
            f"rank {env.rank} needs GPU {env.local_rank} but {torch.cuda.device_count()} are visible — "
            "give the run one GPU per process (resources.gpus = train.world_size)",
            code="unsupported",
        )
    torch.cuda.set_device(env.local_rank)
    return torch.device("cuda", env.local_rank)


def open_gang(env: RankEnv | None, device: torch.device, timeout_s: int) -> Gang:
    """The gang this process belongs to (a plain `Gang` when started alone or as the only rank)."""
    if env is None or env.world_size == 1:
        return Gang()
    return ProcessGang(env, device, timeout_s)
