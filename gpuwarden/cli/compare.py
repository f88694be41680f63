"""`gpuwarden compare RUN_A RUN_B`: a before/after, side by side with B/A ratios."""

from __future__ import annotations

from pathlib import Path

import click

from gpuwarden.cli.format import print_json


@click.command()
@click.argument("run_a")
@click.argument("run_b")
@click.option("--json", "as_json", is_flag=True, help="the comparison as one JSON document")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), help="read runs from this database")
def compare(run_a: str, run_b: str, as_json: bool, db: Path | None) -> None:
    """Compare two runs (ids or names): samples/s, power, utilisation, memory, energy, wall time."""
    from gpuwarden.cli.report_format import render_comparison
    from gpuwarden.client.run_data import open_run_data
    from gpuwarden.core.report.compare import compare_reports
    from gpuwarden.core.report.performance import build_report
    from gpuwarden.core.report.snapshot import collect_run

    data = open_run_data(db)
    try:
        a = build_report(collect_run(data, run_a))
        b = build_report(collect_run(data, run_b))
    finally:
        data.close()
    result = compare_reports(a, b)
    if as_json:
        print_json(result)
    else:
        click.echo(render_comparison(result))
