"""Reading the stack dumps of a hung gang: which ranks wait in a collective, which do not.

A rank stuck outside any collective (a deadlock, a hung data loader, an endless loop) leaves every
other rank waiting for it inside one (an all-reduce, a barrier). Both `py-spy dump` and Python's
faulthandler name each frame's file, so a rank waits in a collective when one of its threads has
a frame in `torch/distributed`. The ranks that do not are the suspects — when at least one rank
was seen waiting (otherwise the dumps cannot tell who holds the others back).
"""

from __future__ import annotations

from collections.abc import Mapping

_COLLECTIVE_MARKERS = ("torch/distributed/", "torch\\distributed\\")


def in_collective(dump: str) -> bool:
    """Whether a rank's stack dump shows it inside torch.distributed."""
    return any(marker in dump for marker in _COLLECTIVE_MARKERS)


def suspects(dumps: Mapping[int, str | None]) -> list[int]:
    """The ranks whose dump shows them outside any collective while another rank waits in one
    (ranks without a dump are never suspects)."""
    read = {rank: text for rank, text in dumps.items() if text}
    waiting = [rank for rank, text in read.items() if in_collective(text)]
    if not waiting:
        return []
    return sorted(rank for rank in read if rank not in waiting)
