"""Several hosts over ssh: a real sshd on 127.0.0.1 and one daemon per host (fake GPUs), each
host an alias of a private ssh config, as tests/fleet sets them up.

- `gpuwarden ps --host …` with 1 and with 4 hosts (and `ps` on a host's own socket beside
  them): a fresh CLI process, from its start to its exit (ssh login, `gpuwarden
  status --socket` there, the forward, the API call, the tunnels closed), the hosts in
  parallel threads.
- the dashboard's first paint with 1 and with 4 hosts: a fresh interpreter, from its start until
  the hosts tab lists every GPU of every host.

Needs OpenSSH's sshd (`apt-get install openssh-server`); without it the module says so and
measures nothing. Informative rows: what a user waits for depends on their network.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from bench.figures import REPEATS, figure_row, main_for
from tests.fleet.conftest import World, sshd_missing, started_sshd, started_world

HOSTS = {"h1": "h100x2", "h2": "a100-80gb", "h3": "h100x4", "h4": "h100x1"}

_FIRST_PAINT = textwrap.dedent(
    """
    import time
    t0 = time.perf_counter()
    import asyncio, json, sys
    from gpuwarden.client.hosts import Fleet
    from gpuwarden.client.ssh_forward import SshCommand
    from gpuwarden.core.config.settings import load_settings
    from gpuwarden.tui.app import GpuwardenApp
    from gpuwarden.tui.fleet_backend import FleetBackend

    names, gpus = sys.argv[1].split(","), int(sys.argv[2])

    async def main():
        settings = load_settings()
        fleet = Fleet(names, SshCommand.of(settings.ssh), settings.resolve_paths().runtime_dir)
        app = GpuwardenApp(FleetBackend(fleet))
        async with app.run_test(size=(80, 24)) as pilot:
            table = app.query_one("#hosts-table")
            while table.row_count < gpus:
                await pilot.pause(0.005)
            await pilot.pause()  # the refresh that paints them
            print(json.dumps({"s": time.perf_counter() - t0}))

    asyncio.run(main())
    """
)


def _gpus(names: list[str]) -> int:
    counts = {"h100x2": 2, "a100-80gb": 1, "h100x4": 4, "h100x1": 1}
    return sum(counts[HOSTS[n]] for n in names)


def ps_time(world: World, names: list[str], *, first_contact: bool = False) -> dict[str, Any]:
    """`first_contact`: with no socket remembered, so each host is asked where its daemon is."""
    seconds = []
    remembered = world.client_root / "run" / "gpuwarden" / "ssh" / "sockets.json"
    for _ in range(REPEATS):
        if first_contact:
            remembered.unlink(missing_ok=True)
        start = time.perf_counter()
        done = world.cli("ps", "--host", ",".join(names))
        seconds.append(time.perf_counter() - start)
        assert done.returncode == 0, done.stdout + done.stderr
    what = "first contact (socket path asked there)" if first_contact else "socket path remembered"
    return figure_row(f"`gpuwarden ps --host` over ssh, {len(names)} host(s), {what}", seconds, "s")


def ps_local(world: World) -> dict[str, Any]:
    """The same `ps` on h1's own socket, no ssh: what the tunnels add is the difference."""
    seconds = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        done = world.hosts["h1"].cli("ps")
        seconds.append(time.perf_counter() - start)
        assert done.returncode == 0, done.stdout + done.stderr
    return figure_row("`gpuwarden ps` on the host's own socket (no ssh), fresh CLI", seconds, "s")


def first_paint(world: World, names: list[str]) -> dict[str, Any]:
    seconds = []
    for _ in range(REPEATS):
        out = subprocess.run(
            [sys.executable, "-c", _FIRST_PAINT, ",".join(names), str(_gpus(names))],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
            env=world.env,
            cwd=world.client_root,
        )
        seconds.append(json.loads(out.stdout.strip().splitlines()[-1])["s"])
    return figure_row(
        f"tui first paint over ssh, {len(names)} host(s), {_gpus(names)} GPUs in the hosts tab", seconds, "s"
    )


def run() -> list[dict[str, Any]]:
    missing = sshd_missing()
    if missing:
        print(f"bench fleet: skipped — {missing}", file=sys.stderr)
        return []
    one, four = ["h1"], list(HOSTS)
    with (
        started_sshd() as sshd,
        tempfile.TemporaryDirectory(prefix="gwb") as root,
        started_world(sshd, Path(root), HOSTS) as world,
    ):
        rows = [ps_local(world), ps_time(world, one, first_contact=True), ps_time(world, one)]
        rows.append(ps_time(world, four))
        return [*rows, first_paint(world, one), first_paint(world, four)]


if __name__ == "__main__":
    raise SystemExit(main_for(run))
