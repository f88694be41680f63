"""`gpuwarden gpus`: static facts and a current reading per GPU (read directly through NVML)."""

from __future__ import annotations

import time

import click

from gpuwarden.cli.format import gpu_line, note, print_json
from gpuwarden.core.units import gib


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def gpus(as_json: bool) -> None:
    """List GPUs: name, UUID, memory, power limit, compute capability, and a current sample."""
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
