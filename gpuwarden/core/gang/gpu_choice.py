"""Which N GPUs a multi-GPU run gets: enough free memory first, then the best-connected set.

A data-parallel gang all-reduces its gradients on every step, so its slowest link sets the pace,
and every rank needs the same memory, so its emptiest GPU bounds the batch. Among the sets whose
emptiest GPU has at least `MEMORY_SHARE` of the best set's, the set whose worst pair is closest
wins (NVLink, then one PCIe switch, several switches, a host bridge, a NUMA node, across sockets);
ties go to the set with more free memory, fewer runs already placed, then lower indices. Without
topology (NVML said nothing) the GPUs with the most free memory win, as for one GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from gpuwarden.core.telemetry.topology import NO_TOPOLOGY, GpuTopology

# A set may give up a tenth of the free memory of the emptiest GPU for a better link, not more.
MEMORY_SHARE = 0.9
UNKNOWN_DISTANCE = 60  # worse than across sockets: a link NVML did not describe
MAX_SETS = 20_000  # beyond this many combinations, memory order alone decides


@dataclass(frozen=True)
class Candidate:
    """A GPU the run may use now."""

    uuid: str
    index: int
    free: int | None  # bytes; None = unknown
    busy: int = 0  # runs already placed on it


def _by_memory(candidates: Sequence[Candidate]) -> list[Candidate]:
    # most free memory first; unknown free memory last; index breaks ties so placement is stable
    return sorted(candidates, key=lambda g: (g.free is None, -(g.free or 0), g.busy, g.index))


def _set_key(gpus: Sequence[Candidate], topology: GpuTopology) -> tuple[int, int, int, int, list[int]]:
    distances = [topology.distance(a.uuid, b.uuid) for a, b in combinations(gpus, 2)]
    known = [UNKNOWN_DISTANCE if d is None else d for d in distances]
    return (
        max(known),
        sum(known),
        -min(g.free or 0 for g in gpus),
        sum(g.busy for g in gpus),
        sorted(g.index for g in gpus),
    )


def choose_gpus(candidates: Sequence[Candidate], n: int, topology: GpuTopology = NO_TOPOLOGY) -> list[str]:
    """The UUIDs of `n` of `candidates` (in index order, so rank r gets the r-th), as above.

    Raises ValueError when fewer than `n` candidates are given.
    """
    if n > len(candidates):
        raise ValueError(f"{n} GPUs wanted, {len(candidates)} available")
    if n <= 0:
        return []
    if n == 1 or not topology.known or math.comb(len(candidates), n) > MAX_SETS:
        chosen: Sequence[Candidate] = _by_memory(candidates)[:n]
    else:
        sets = list(combinations(candidates, n))
        best_free = max(min(g.free or 0 for g in s) for s in sets)
        eligible = [s for s in sets if min(g.free or 0 for g in s) >= MEMORY_SHARE * best_free]
        chosen = min(eligible, key=lambda s: _set_key(s, topology))
    return [g.uuid for g in sorted(chosen, key=lambda g: g.index)]
