"""`gpuwarden clean`: free GPU memory held by your own stray processes (the first fix for an
out-of-memory card: "find and close other GPU processes"). Runs are never touched: stop them with
`gpuwarden stop`."""

from __future__ import annotations

import click

from gpuwarden.cli.format import print_json
from gpuwarden.cli.gpu_choice import select_gpus
from gpuwarden.client import ApiClient
from gpuwarden.core.units import gib


@click.command()
@click.option("--gpu", "gpu_filter", default=None, help="Only processes on this GPU (index or UUID prefix).")
@click.option("--grace", type=click.FloatRange(0, 600), default=5.0, show_default=True,
              help="Seconds between SIGTERM and SIGKILL.")  # fmt: skip
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print what was terminated as JSON (implies --yes).")
def clean(gpu_filter: str | None, grace: float, yes: bool, as_json: bool) -> None:
    """Terminate your own GPU processes that are not part of a gpuwarden run."""
    import os
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    with ApiClient() as client:
        gpus = client.gpus().gpus
        index = {g.uuid: g.index for g in gpus}
        rows = [p for p in client.processes() if p.run_id is None and p.user == me]
        if gpu_filter is not None:
            (chosen,) = select_gpus(gpus, [gpu_filter])  # one that names no GPU is an error
            rows = [p for p in rows if p.uuid == chosen.uuid]
        if not rows:
            if as_json:
                print_json({"terminated": []})
            else:
                click.echo("no stray GPU processes of yours (runs are left alone)")
            return
        if not as_json:
            for p in rows:
                command = p.cmdline or p.name
                click.echo(f"GPU {index.get(p.uuid, '?')}  pid {p.pid}  {gib(p.used_memory)} GiB  {command}")
            if not yes and not click.confirm(f"terminate these {len(rows)} process(es)?", default=False):
                click.echo("nothing terminated")
                return
        done = [client.terminate_process(p.pid, grace) for p in rows]
    if as_json:
        print_json({"terminated": done})
        return
    for d in done:
        after = f"SIGKILL after {d.sigkill_after_s:g} s"
        click.echo(f"terminated pid {d.pid} ({d.name or '?'}): SIGTERM, {after} if it stays")
