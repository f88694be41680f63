"""Choosing the GPUs of a multi-GPU run: free memory first, then the best-linked set, with the
topology read through NVML (the fake NVML's links)."""

from __future__ import annotations

from gpuwarden.core.config.spec import Resources
from gpuwarden.core.gang.gpu_choice import Candidate, choose_gpus
from gpuwarden.core.telemetry.fake_nvml import FakeNvml
from gpuwarden.core.telemetry.nvml import NvmlReader
from gpuwarden.core.telemetry.topology import NO_TOPOLOGY, GpuTopology, PcieLevel
from gpuwarden.daemon.placement import GpuState, place

GIB = 1024**3


def reader(fake: FakeNvml) -> NvmlReader:
    return NvmlReader(fake, enrich=lambda rows: None)


def candidates(fake: FakeNvml, free_gib: list[float]) -> list[Candidate]:
    return [Candidate(fake.uuid(i), i, int(f * GIB)) for i, f in enumerate(free_gib)]


def test_pcie_switch_pairs_are_preferred_over_pairs_across_the_node() -> None:
    fake = FakeNvml("geforce-12gbx4")  # 0-1 and 2-3 share a switch
    topology = reader(fake).topology()
    assert topology.link(fake.uuid(0), fake.uuid(1)).pcie == PcieLevel.SINGLE  # type: ignore[union-attr]
    assert topology.link(fake.uuid(1), fake.uuid(2)).pcie == PcieLevel.NODE  # type: ignore[union-attr]
    # by memory alone 1 and 2 would win; the switch pair 2-3 has nearly as much
    free = [10.0, 11.8, 11.9, 11.5]
    assert choose_gpus(candidates(fake, free), 2, NO_TOPOLOGY) == [fake.uuid(1), fake.uuid(2)]
    assert choose_gpus(candidates(fake, free), 2, topology) == [fake.uuid(2), fake.uuid(3)]


def test_nvlink_beats_any_pcie_path() -> None:
    fake = FakeNvml("a100-80gbx4")
    fake.set_nvlink(1, 3, 4)  # a bridge across the switch pairs
    topology = reader(fake).topology()
    assert topology.link(fake.uuid(1), fake.uuid(3)).nvlinks == 4  # type: ignore[union-attr]
    assert topology.distance(fake.uuid(0), fake.uuid(1)) == PcieLevel.SINGLE
    chosen = choose_gpus(candidates(fake, [70, 70, 70, 70]), 2, topology)
    assert chosen == [fake.uuid(1), fake.uuid(3)]


def test_nvswitch_links_every_pair_so_memory_decides() -> None:
    fake = FakeNvml("h100x4")
    topology = reader(fake).topology()
    assert {link.nvlinks for link in topology.links.values()} == {18}
    chosen = choose_gpus(candidates(fake, [10, 70, 20, 60]), 2, topology)
    assert chosen == [fake.uuid(1), fake.uuid(3)]


def test_a_better_link_never_costs_more_than_a_tenth_of_the_memory() -> None:
    fake = FakeNvml("geforce-12gbx4")
    topology = reader(fake).topology()
    # the switch pairs have one nearly full GPU each: the far pair with room wins
    chosen = choose_gpus(candidates(fake, [11.5, 2.0, 3.0, 11.0]), 2, topology)
    assert chosen == [fake.uuid(0), fake.uuid(3)]


def test_three_of_eight_take_the_closest_group() -> None:
    fake = FakeNvml("a100-80gbx8")  # pairs on switches, quads per NUMA node, halves per socket
    topology = reader(fake).topology()
    chosen = choose_gpus(candidates(fake, [40.0] * 8), 3, topology)
    assert chosen == [fake.uuid(0), fake.uuid(1), fake.uuid(2)]  # a switch pair and its NUMA node


def test_placement_uses_the_topology_and_keeps_its_signature() -> None:
    fake = FakeNvml("geforce-12gbx4")
    topology = reader(fake).topology()
    gpus = [GpuState(fake.uuid(i), i, 12 * GIB, used) for i, used in enumerate([2 * GIB, 0, 0, 1 * GIB])]
    resources = Resources.model_validate({"gpus": 2})
    plain = place(resources, gpus, {}, 1)
    linked = place(resources, gpus, {}, 1, topology=topology)
    assert plain is not None and plain.gpus == [fake.uuid(1), fake.uuid(2)]
    assert linked is not None and linked.gpus == [fake.uuid(2), fake.uuid(3)]


def test_without_gpus_to_choose_from_nothing_is_chosen() -> None:
    assert choose_gpus([], 0, GpuTopology()) == []
