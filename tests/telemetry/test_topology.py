"""GPU topology through the NVML reader: PCIe ancestors and NVLink (bridges and NVSwitches) from
the fake NVML, unsupported queries left unknown, and the sampler and readers handing it on."""

from __future__ import annotations

from gpuwarden.core.telemetry.fake_nvml import FakeNvml
from gpuwarden.core.telemetry.nvml import NoGpuReader, NvmlReader
from gpuwarden.core.telemetry.sampler import Sampler
from gpuwarden.core.telemetry.topology import GpuLink, PcieLevel


def reader(fake: FakeNvml) -> NvmlReader:
    return NvmlReader(fake, enrich=lambda rows: None)


def test_pcie_levels_and_bridges_are_read_per_pair() -> None:
    fake = FakeNvml("a100-80gbx4")
    fake.set_nvlink(0, 3, 2)
    fake.set_pcie_level(2, 3, 20)
    topology = reader(fake).topology()
    assert len(topology.links) == 6
    assert topology.link(fake.uuid(0), fake.uuid(1)) == GpuLink(0, PcieLevel.SINGLE)
    assert topology.link(fake.uuid(2), fake.uuid(3)) == GpuLink(0, PcieLevel.MULTIPLE)
    assert topology.link(fake.uuid(3), fake.uuid(0)) == GpuLink(2, PcieLevel.NODE)
    assert topology.distance(fake.uuid(0), fake.uuid(3)) == 0


def test_nvswitch_links_every_gpu_to_every_other() -> None:
    fake = FakeNvml("h100x8")
    topology = reader(fake).topology()
    assert len(topology.links) == 28 and all(link.nvlinks == 18 for link in topology.links.values())
    assert topology.link(fake.uuid(0), fake.uuid(7)).pcie == PcieLevel.SYSTEM  # type: ignore[union-attr]


def test_cards_without_nvlink_are_asked_once_per_gpu_and_say_so() -> None:
    fake = FakeNvml("geforce-12gbx2")
    topology = reader(fake).topology()
    assert topology.link(fake.uuid(0), fake.uuid(1)) == GpuLink(0, PcieLevel.SINGLE)
    assert fake.calls["nvmlDeviceGetNvLinkState", 0] == 1 and fake.calls["nvmlDeviceGetNvLinkState", 1] == 1


def test_a_driver_without_topology_queries_leaves_links_unknown() -> None:
    fake = FakeNvml("old-bindingx2")
    fake.nvmlDeviceGetTopologyCommonAncestor = None  # type: ignore[assignment,method-assign]
    topology = reader(fake).topology()
    assert not topology.known and topology.link(fake.uuid(0), fake.uuid(1)) == GpuLink(0, None)


def test_one_gpu_or_none_has_no_pairs_and_the_sampler_hands_topology_on() -> None:
    assert reader(FakeNvml("h100")).topology().links == {}
    assert NoGpuReader("no driver").topology().links == {}
    fake = FakeNvml("geforce-12gbx2")
    sampler = Sampler(reader(fake), None, process_interval=5.0)
    assert sampler.topology().link(fake.uuid(0), fake.uuid(1)) is not None
