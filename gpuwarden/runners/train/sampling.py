"""Data order by sample position, so a resume continues at the same sample whatever the micro-batch.

The run sees an endless stream of samples: position `p` is sample `perm(seed, e)[p % n]` of epoch
`e = p // n`, where `perm` is a permutation fixed by (seed, epoch). An attempt starts the stream
at `samples_seen` from its checkpoint. Nothing here draws from the global RNGs, so building a
loader does not shift the dropout/noise random streams of the training step.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

SampleKey = tuple[int, int]  # (epoch, index in the dataset)

_MASK63 = (1 << 63) - 1


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from several integers (splitmix64-style), stable across processes and runs."""
    acc = 0x9E3779B97F4A7C15
    for part in parts:
        acc = (acc ^ (part & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        acc = (acc ^ (acc >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        acc ^= acc >> 31
    return acc & _MASK63


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The order of the `n` dataset items in `epoch` (the same in every process for a seed)."""
    gen = torch.Generator().manual_seed(mix_seed(seed, epoch))
    return torch.randperm(n, generator=gen)


def rank_positions(start: int, stop: int, rank: int, world_size: int, per_rank: int) -> Iterator[int]:
    """The stream positions rank `rank` trains on: every optimizer step takes the next
    `per_rank × world_size` positions, and rank r gets the r-th block of `per_rank` of them.

    The gang's step therefore covers exactly the positions one process would use for the same
    effective batch, whatever the split into ranks, micro-batches and accumulation.
    """
    step_start = start
    while step_start < stop:
        first = step_start + rank * per_rank
        yield from range(first, min(first + per_rank, stop))
        step_start += per_rank * world_size


class PositionSampler(Sampler[SampleKey]):
    """Yields `(epoch, index)` keys for stream positions `start … stop-1` (one process), or for
    this rank's share of them (`rank_positions`)."""

    def __init__(
        self,
        n: int,
        seed: int,
        start: int,
        stop: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        per_rank: int = 0,
    ) -> None:
        if n <= 0:
            raise ValueError("the dataset is empty")
        self.n = n
        self.seed = seed
        self.start = start
        self.stop = stop
        self.rank = rank
        self.world_size = world_size
        # one process takes the whole range as one block
        self.per_rank = per_rank if world_size > 1 else max(1, stop - start)

    def __len__(self) -> int:
        total = max(0, self.stop - self.start)
        full, rest = divmod(total, self.per_rank * self.world_size)
        return full * self.per_rank + min(self.per_rank, max(0, rest - self.rank * self.per_rank))

    def _positions(self) -> Iterator[int]:
        return rank_positions(self.start, self.stop, self.rank, self.world_size, self.per_rank)

    def __iter__(self) -> Iterator[SampleKey]:
        perm_epoch = -1
        perm = torch.empty(0, dtype=torch.long)
        for pos in self._positions():
            epoch, offset = divmod(pos, self.n)
            if epoch != perm_epoch:
                perm, perm_epoch = epoch_permutation(self.n, self.seed, epoch), epoch
            yield epoch, int(perm[offset])


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A generator private to one sample of one epoch (random crops, noise): independent of
    batch size, worker count and which process loads it."""
    return torch.Generator().manual_seed(mix_seed(seed, epoch, index, 0x5A17))
