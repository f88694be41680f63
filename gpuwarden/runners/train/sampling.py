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


class PositionSampler(Sampler[SampleKey]):
    """Yields `(epoch, index)` keys for stream positions `start … stop-1`."""

    def __init__(self, n: int, seed: int, start: int, stop: int) -> None:
        if n <= 0:
            raise ValueError("the dataset is empty")
        self.n = n
        self.seed = seed
        self.start = start
        self.stop = stop

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __iter__(self) -> Iterator[SampleKey]:
        pos = self.start
        perm_epoch = -1
        perm = torch.empty(0, dtype=torch.long)
        while pos < self.stop:
            epoch, offset = divmod(pos, self.n)
            if epoch != perm_epoch:
                perm, perm_epoch = epoch_permutation(self.n, self.seed, epoch), epoch
            yield epoch, int(perm[offset])
            pos += 1


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A generator private to one sample of one epoch (random crops, noise): independent of
    batch size, worker count and which process loads it."""
    return torch.Generator().manual_seed(mix_seed(seed, epoch, index, 0x5A17))
