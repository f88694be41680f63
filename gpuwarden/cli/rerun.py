"""`gpuwarden rerun RUN [--knob NAME=VALUE]…`: a new run from an old run's spec, with changes.

The daemon keeps each run's spec as it last ran (paths absolute, a person's edits and the
retunes' settings included), so a finished run is run again without its file, and with a knob
changed (`--knob batch_size=8`) the way the dashboard's edit dialog names knobs: a command run's
own knobs by name, a train or infer run's settings by theirs (`batch_size` is `train.batch_size`),
any other spec key by its dotted path.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from gpuwarden.cli.format import print_json
from gpuwarden.cli.run_source import daemon_client
from gpuwarden.core.errors import UserError
from gpuwarden.tui.rerun_spec import effective_batch_note, rerun_spec


def _typed(pairs: tuple[str, ...]) -> dict[str, Any]:
    from gpuwarden.core.command.presets import parse_value

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--knob {pair!r}: write it as NAME=VALUE, e.g. --knob batch_size=8")
        out[key.strip()] = parse_value(text)
    return out


@click.command()
@click.argument("run")
@click.option(
    "--knob",
    "knobs",
    multiple=True,
    metavar="NAME=VALUE",
    help="A changed knob (repeatable): a command run's knob, a train or infer setting, or a dotted key.",
)
@click.option("--name", default=None, help="The new run's name (default: the old run's).")
@click.option("-f", "--follow", is_flag=True, help="Stream state, events and output until the run ends.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (and nothing else) on stdout.")
def rerun(run: str, knobs: tuple[str, ...], name: str | None, follow: bool, as_json: bool) -> None:
    """Submit a new run from RUN's spec (as it last ran), with the given knobs changed.

    It starts from this shell's environment, as `gpuwarden run` does; RUN is left as it is.
    """
    typed = _typed(knobs)
    with daemon_client() as client:
        old = client.run(run)
        document = rerun_spec(str(old.kind), old.spec, typed, name)
        new = client.submit(document, environment=os.environ)
        note = effective_batch_note(str(old.kind), old.spec, new.spec)
        if note is not None and not as_json:
            click.echo(note, err=True)
        if not follow:
            if as_json:
                print_json(new)
            else:
                click.echo(f"{new.id}  {new.name}  {new.state}  (again from {old.id}; run dir {new.run_dir})")
            return
        from gpuwarden.cli.runs_cmds import follow_run

        if not as_json:
            click.echo(f"{new.id}  {new.name}  submitted (again from {old.id})", err=True)
        final = follow_run(client, new.id, as_json)
    if as_json:
        print_json(final)
    sys.exit(0 if final.state == "succeeded" else 1)
