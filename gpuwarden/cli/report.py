"""`gpuwarden report RUN`: throughput, time per batch size, memory, energy, power and retunes."""

from __future__ import annotations

from pathlib import Path

import click

from gpuwarden.cli.format import print_json
from gpuwarden.cli.run_source import runs_option
from gpuwarden.core.errors import UserError


@click.command()
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="the report as one JSON document")
@click.option("--md", "as_md", is_flag=True, help="the report as Markdown")
@click.option("--plots", type=click.Path(file_okay=False, path_type=Path), help="write PNG plots here")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), help="read runs from this database")
@runs_option
def report(
    run: str, as_json: bool, as_md: bool, plots: Path | None, db: Path | None, runs_dir: Path | None
) -> None:
    """Performance report of a run (id or name), from its recorded data."""
    if as_json and as_md:
        raise UserError("--json and --md both given — choose one output format")
    if runs_dir is not None:
        if db is not None:
            raise UserError("--db and --runs both given — a run folder holds its own database: give one")
        from gpuwarden.client.run_folders import RunFolders

        db = RunFolders(runs_dir).store_of(run)
    from gpuwarden.cli.report_format import render_markdown, render_text
    from gpuwarden.client.run_data import open_run_data
    from gpuwarden.core.report.performance import build_report
    from gpuwarden.core.report.snapshot import collect_run

    data = open_run_data(db)
    try:
        snap = collect_run(data, run)
    finally:
        data.close()
    result = build_report(snap)
    if plots is not None:
        from gpuwarden.cli.report_plots import why_no_plots, write_plots

        result["plots"] = write_plots(snap, plots)
        if not result["plots"]:
            click.echo(why_no_plots(snap), err=True)
    if as_json:
        print_json(result)
    elif as_md:
        click.echo(render_markdown(result), nl=False)
    else:
        click.echo(render_text(result))
        for path in result.get("plots", []):
            click.echo(f"plot: {path}")
