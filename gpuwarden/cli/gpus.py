"""`gpuwarden gpus`: static facts and a current reading per GPU (read directly through NVML)."""

from __future__ import annotations

import time

import click

from gpuwarden.cli.fleet_option import chosen_hosts, hosts_option
from gpuwarden.cli.format import gpu_line, note, print_json
from gpuwarden.core.units import gib


@click.command()
@hosts_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def gpus(hosts: tuple[str, ...], all_hosts: bool, as_json: bool) -> None:
    """List GPUs: name, UUID, memory, power limit, compute capability, and a current sample
    (read here through NVML; with --host, each host's daemon's latest reading)."""
    if hosts or all_hosts:
        from gpuwarden.cli.fleet_cmds import fleet_gpus

        fleet_gpus(chosen_hosts(hosts, all_hosts), as_json)
        return
    from gpuwarden.core.telemetry.nvml import open_gpu_reader

    reader = open_gpu_reader()
    try:
        statics = reader.gpus()
        samples = {s.uuid: s for s in reader.sample(time.time())} if statics else {}
        if as_json:
            print_json(
                {
                    "gpus": [
                        {**g.to_dict(), "sample": samples[g.uuid].to_dict() if g.uuid in samples else None}
                        for g in statics
                    ],
                    "reason": reader.status,
                }
            )
            return
        if reader.status:
            note(reader.status)
        if not statics:
            click.echo("no GPUs")
            return
        for g in statics:
            click.echo(
                f"[{g.index}] {g.name}  {g.uuid}  bus {g.pci_bus_id or 'n/a'}  {gib(g.memory_total)} GiB"
                f"  cc {g.compute_capability or 'n/a'}  driver {g.driver_version or 'n/a'}"
                f" (CUDA {g.cuda_driver_version or 'n/a'})  MIG {_mig(g.mig_mode)}"
            )
            if g.uuid in samples:
                click.echo("    " + gpu_line(g, samples[g.uuid], labelled=False))
    finally:
        reader.close()


def _mig(mode: bool | None) -> str:
    return "n/a" if mode is None else ("on" if mode else "off")
