"""Which GPUs a run gets: by free memory in the latest samples, at most N runs per GPU; a run
of several GPUs also by how they are linked (`gpuwarden.core.gang.gpu_choice`).

Pure functions over plain records, so the policy is tested without a daemon.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuwarden.core.config.spec import Resources
from gpuwarden.core.errors import UserError
from gpuwarden.core.gang.gpu_choice import Candidate, choose_gpus
from gpuwarden.core.telemetry.topology import NO_TOPOLOGY, GpuTopology
from gpuwarden.core.units import gib


@dataclass(frozen=True)
class GpuState:
    """What placement needs to know of one GPU."""

    uuid: str
    index: int
    memory_total: int | None
    memory_used: int | None
    lost: bool = False

    @property
    def free(self) -> int | None:
        if self.memory_total is None or self.memory_used is None:
            return None
        return max(0, self.memory_total - self.memory_used)


@dataclass(frozen=True)
class Placement:
    """GPUs (UUIDs) for a run; an empty list is a CPU run, `warning` says why when it was not asked."""

    gpus: list[str]
    warning: str | None = None

    @property
    def cpu(self) -> bool:
        return not self.gpus

    def env(self) -> dict[str, str]:
        """The CUDA variables the child gets: PCI bus order and the chosen UUIDs ("" = no GPU)."""
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(self.gpus)}


def _named(gpus: Sequence[GpuState], names: Sequence[str]) -> list[GpuState]:
    """GPUs named by UUID, UUID prefix or index (indices come as text or numbers)."""
    chosen = []
    for name in names:
        match = [g for g in gpus if g.uuid == name or str(g.index) == name.strip() or g.uuid.startswith(name)]
        if len(match) != 1:
            known = ", ".join(f"{g.index}={g.uuid}" for g in gpus) or "none"
            raise UserError(f"resources.gpus: no single GPU matches '{name}' — GPUs here: {known}")
        chosen.append(match[0])
    return chosen


def check_feasible(resources: Resources, gpus: Sequence[GpuState]) -> None:
    """Raise UserError at submit time for requests no amount of waiting can satisfy."""
    wanted = resources.gpus
    if wanted == 0:
        return
    if not gpus:
        if not resources.allow_cpu:
            raise UserError(
                "resources: the run needs a GPU, none was found, and allow_cpu is false — set allow_cpu: true"
            )
        return
    if isinstance(wanted, list):
        _named(gpus, [str(w) for w in wanted])
    elif wanted > len(gpus):
        raise UserError(f"resources.gpus: asks for {wanted} GPUs but this machine has {len(gpus)}")


def place(
    resources: Resources,
    gpus: Sequence[GpuState],
    busy: Mapping[str, int],
    max_runs_per_gpu: int,
    topology: GpuTopology = NO_TOPOLOGY,
) -> Placement | None:
    """GPUs for a run now, or None when it must wait in the queue.

    `busy` counts the runs already placed on each GPU UUID. With no GPU on the machine a run that
    allows the CPU runs there (with a warning); gpus: 0 always means the CPU. A run of several
    GPUs gets a well-linked set when `topology` (the NVML reader's) says which that is.
    """
    wanted = resources.gpus
    if wanted == 0:
        return Placement([])
    if not gpus:
        if resources.allow_cpu:
            return Placement(
                [],
                warning="no GPU found: running on the CPU instead (to ask for the CPU, and not be "
                "told this, set resources.gpus: 0 or run with --gpus 0; to wait for a GPU rather, "
                "resources.allow_cpu: false)",
            )
        return None
    need = resources.min_free_memory

    def fits(g: GpuState) -> bool:
        if g.lost or busy.get(g.uuid, 0) >= max_runs_per_gpu:
            return False
        return need is None or (g.free is not None and g.free >= int(need))

    if isinstance(wanted, list):
        chosen = _named(gpus, [str(w) for w in wanted])
        return Placement([g.uuid for g in chosen]) if all(fits(g) for g in chosen) else None
    candidates = [Candidate(g.uuid, g.index, g.free, busy.get(g.uuid, 0)) for g in gpus if fits(g)]
    if len(candidates) < wanted:
        return None
    return Placement(choose_gpus(candidates, wanted, topology))


def why_waiting(
    resources: Resources, gpus: Sequence[GpuState], busy: Mapping[str, int], max_runs_per_gpu: int
) -> str:
    """Why `place` gave a run no GPUs now, as its queued message says it: what it waits for and
    what there is (a run of several GPUs waits for all of them at once)."""
    if not gpus:
        return "waiting for a GPU: none found (resources.allow_cpu: true runs it on the CPU)"
    need = resources.min_free_memory
    with_memory = f" with {gib(int(need))} GiB free" if need is not None else ""

    def free(g: GpuState) -> bool:
        if g.lost or busy.get(g.uuid, 0) >= max_runs_per_gpu:
            return False
        return need is None or (g.free is not None and g.free >= int(need))

    wanted = resources.gpus
    if isinstance(wanted, list):
        waits = [str(g.index) for g in _named(gpus, [str(w) for w in wanted]) if not free(g)]
        return (
            f"waiting for GPU {', '.join(waits)}{with_memory} (another run has it, or its memory is in use)"
        )
    ready = sum(free(g) for g in gpus)
    return f"waiting for {wanted} GPU{'s' if wanted != 1 else ''}{with_memory}: {ready} free now"
