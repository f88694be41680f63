"""How the GPUs of a machine are connected, as NVML reports it (read once; it does not change).

For each pair of GPUs: the NVLink links between them (through an NVSwitch, every GPU attached to
the switch counts as linked to every other), and the closest PCIe ancestor they share. Gangs of
several GPUs exchange gradients on every step, so placement prefers sets whose worst pair is
closest (`gpuwarden.core.gang.gpu_choice`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum


class PcieLevel(IntEnum):
    """NVML's topology levels (nvmlGpuTopologyLevel_t): the closest path a pair shares, nearest first."""

    INTERNAL = 0  # the same board (a dual-GPU card)
    SINGLE = 10  # one PCIe switch
    MULTIPLE = 20  # several PCIe switches, no host bridge between
    HOSTBRIDGE = 30  # the same PCIe host bridge
    NODE = 40  # the same NUMA node (CPU socket), across host bridges
    SYSTEM = 50  # across CPU sockets


@dataclass(frozen=True)
class GpuLink:
    """The connection between two GPUs."""

    nvlinks: int = 0  # active NVLink links between them (0: none, or not reported)
    pcie: PcieLevel | None = None  # None: NVML could not tell

    @property
    def distance(self) -> int | None:
        """0 over NVLink, else the PCIe level (lower is closer); None when nothing is known."""
        if self.nvlinks > 0:
            return 0
        return int(self.pcie) if self.pcie is not None else None

    def describe(self) -> str:
        if self.nvlinks:
            return f"NVLink ×{self.nvlinks}"
        return self.pcie.name.lower() if self.pcie is not None else "unknown"


@dataclass(frozen=True)
class GpuTopology:
    """Links between GPU pairs, by UUID; an empty topology means NVML said nothing."""

    links: Mapping[frozenset[str], GpuLink] = field(default_factory=dict)

    def link(self, a: str, b: str) -> GpuLink | None:
        return self.links.get(frozenset((a, b)))

    def distance(self, a: str, b: str) -> int | None:
        link = self.link(a, b)
        return link.distance if link is not None else None

    @property
    def known(self) -> bool:
        return any(link.distance is not None for link in self.links.values())


NO_TOPOLOGY = GpuTopology()
