"""Reading the GPU topology through NVML: PCIe common ancestors and NVLink links per pair.

Every call may be unsupported (consumer cards have no NVLink; some drivers refuse topology
queries inside containers): what cannot be read is left unknown, never guessed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuwarden.core.telemetry.topology import GpuLink, GpuTopology, PcieLevel

log = logging.getLogger(__name__)

_MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS in current drivers (H100: 18 used)
_FEATURE_ENABLED = 1
_DEVICE_TYPE_SWITCH = 2  # nvmlNvLinkDeviceType_t


@dataclass(frozen=True)
class TopologyGpu:
    """What the topology reader needs of one GPU."""

    uuid: str
    handle: Any
    pci_bus_id: str | None


def _bus_key(bus_id: Any) -> str:
    """A PCI bus id comparable across NVML's forms ("00000000:18:00.0", "0000:18:00.0", bytes)."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
    parts = text.strip().lower().split(":")
    domain = parts[0] if len(parts) == 3 else "0"
    try:
        return f"{int(domain, 16):x}:" + ":".join(parts[-2:])
    except ValueError:
        return text


def _pcie_level(nvml: Any, a: TopologyGpu, b: TopologyGpu, error: type[BaseException]) -> PcieLevel | None:
    fn = getattr(nvml, "nvmlDeviceGetTopologyCommonAncestor", None)
    if fn is None:
        return None
    try:
        return PcieLevel(int(fn(a.handle, b.handle)))
    except (error, ValueError) as err:
        log.info("NVML topology of %s and %s unavailable (%s)", a.uuid, b.uuid, err)
        return None


def nvlink_peers(
    nvml: Any, gpu: TopologyGpu, by_bus: dict[str, str], error: type[BaseException]
) -> dict[str, int]:
    """Active NVLink links of `gpu` by the peer they reach: a GPU's UUID, or "switch"."""
    state = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
    remote = getattr(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", None)
    kind = getattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
    peers: dict[str, int] = {}
    if state is None or remote is None:
        return peers
    for link in range(_MAX_LINKS):
        try:
            if int(state(gpu.handle, link)) != _FEATURE_ENABLED:
                continue
            peer = by_bus.get(_bus_key(remote(gpu.handle, link).busId))
            if peer is None and kind is not None and int(kind(gpu.handle, link)) == _DEVICE_TYPE_SWITCH:
                peer = "switch"
        except error:
            break  # no such link (or no NVLink at all)
        if peer is not None and peer != gpu.uuid:
            peers[peer] = peers.get(peer, 0) + 1
    return peers


def read_topology(nvml: Any, gpus: Sequence[TopologyGpu], error: type[BaseException]) -> GpuTopology:
    """The links between every pair of `gpus` (NVML calls raise `error` when they fail)."""
    if len(gpus) < 2:
        return GpuTopology()
    by_bus = {_bus_key(g.pci_bus_id): g.uuid for g in gpus if g.pci_bus_id}
    peers = {g.uuid: nvlink_peers(nvml, g, by_bus, error) for g in gpus}
    links: dict[frozenset[str], GpuLink] = {}
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            direct = peers[a.uuid].get(b.uuid, 0)
            switched = min(peers[a.uuid].get("switch", 0), peers[b.uuid].get("switch", 0))
            links[frozenset((a.uuid, b.uuid))] = GpuLink(direct + switched, _pcie_level(nvml, a, b, error))
    return GpuTopology(links)
