"""`--gpu ID`: a GPU named by its index, its UUID or a UUID prefix, the same in every command."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from gpuwarden.core.errors import UserError


class NamedGpu(Protocol):
    @property
    def index(self) -> int: ...

    @property
    def uuid(self) -> str: ...


G = TypeVar("G", bound=NamedGpu)


def select_gpus(gpus: Sequence[G], wanted: Sequence[str]) -> list[G]:
    """The GPUs `wanted` names (all when it names none); one that names no GPU, or several, is a
    one-line error listing what there is."""
    if not wanted:
        return list(gpus)
    if not gpus:  # "use an index from: none" would send a newcomer looking for one
        raise UserError(f"--gpu {wanted[0]}: this machine has no GPU that NVML sees — leave --gpu out")
    chosen: list[G] = []
    for w in wanted:
        matches = [g for g in gpus if str(g.index) == w or g.uuid == w or g.uuid.startswith(w)]
        if len(matches) != 1:
            known = ", ".join(f"{g.index} ({g.uuid})" for g in gpus)
            what = "matches several GPUs" if matches else "matches no GPU"
            raise UserError(f"--gpu {w}: {what} — use an index or UUID from: {known}")
        if matches[0] not in chosen:
            chosen.append(matches[0])
    return chosen
