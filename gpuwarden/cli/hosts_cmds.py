"""`gpuwarden hosts`: can each host be reached over ssh, and how is its daemon."""

from __future__ import annotations

import click

from gpuwarden.cli.fleet_option import chosen_hosts, fleet, hosts_option
from gpuwarden.cli.format import print_json
from gpuwarden.core.api import Health


@click.command()
@hosts_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def hosts(hosts: tuple[str, ...], all_hosts: bool, as_json: bool) -> None:
    """Reach each host (the config's `hosts:` list unless --host names them) and say how it is."""
    names = chosen_hosts(hosts, all_hosts or not hosts)
    with fleet(names) as links:
        answers = links.each(lambda client: client.health())
    if as_json:
        print_json(
            {
                "hosts": [
                    {"host": a.host, **({"health": a.value} if a.ok else {"error": a.error, "code": a.code})}
                    for a in answers
                ]
            }
        )
    for a in [] if as_json else answers:
        click.echo(f"host {a.host}: {_health_line(a.value) if a.value is not None else a.error}")
    if not all(a.ok for a in answers):
        raise SystemExit(1)


def _health_line(health: Health) -> str:
    return f"gpuwarden {health.version}, {health.active_runs} active run(s); {health.gpu_status}"
