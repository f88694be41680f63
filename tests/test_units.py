"""The one byte/unit formatter the CLI and the dashboard share."""

from __future__ import annotations

from gpuwarden.core.units import GIB, MIB, duration, energy, gib, named, size


def test_sizes_pick_the_unit_that_keeps_the_number_short() -> None:
    assert size(None) == "–"
    assert size(512) == "512 B"
    assert size(12 * 1024) == "12 KiB"
    assert size(134_217_728) == "128 MiB"
    assert size(993_251_328) == "947 MiB"
    assert size(1_717_986_918) == "1.6 GiB"
    assert size(80 * GIB) == "80 GiB"
    assert size(2048 * GIB) == "2.0 TiB"
    assert gib(23.5 * GIB) == "23.5" and gib(None) == "–"


def test_named_fields_read_in_their_units() -> None:
    assert named("mem_peak", 993_251_328) == "947 MiB"
    assert named("vm_peak", 3 * MIB) == "3.0 MiB"
    assert named("capacity_bytes", GIB) == "1.0 GiB"
    assert named("power_w", 312.456) == "312.5 W"
    assert named("temperature_c", 61) == "61 °C"
    assert named("samples_per_s", 1.5612) == "1.561/s"
    assert named("wall_s", 123.059) == "123.1 s"
    assert named("util_gpu", 42.4) == "42 %"
    assert named("steps", 3) == "3"
    assert named("device", "cpu") == "cpu"
    assert named("loss_last", None) == "–"


def test_durations_and_energy() -> None:
    assert duration(45) == "45s" and duration(725) == "12m05s" and duration(11_220) == "3h07m"
    assert duration(187_200) == "2d04h" and duration(None) == "–"
    assert (
        energy(1234) == "1234 J" and energy(3600 * 12.3) == "12.3 Wh" and energy(3.6e6 * 4.56) == "4.56 kWh"
    )
