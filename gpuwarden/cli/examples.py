"""`gpuwarden example-models [DIR]`: the tiny local models and data the CPU examples use.

Weights cannot be downloaded here, so the examples train on models built from a config with
random weights and a tokenizer trained on a small built-in text — the real loading code still
reads them from disk like any other model.
"""

from __future__ import annotations

from pathlib import Path

import click

from gpuwarden.cli.format import note, print_json
from gpuwarden.core.errors import UserError


@click.command("example-models")
@click.argument("directory", required=False, type=click.Path(path_type=Path), default=Path(".example-models"))
@click.option("--json", "as_json", is_flag=True, help="Print the paths written as JSON.")
def example_models(directory: Path, as_json: bool) -> None:
    """Build the example models and data under DIRECTORY (default ./.example-models, which the
    specs in configs/examples/ expect when run from the repository root)."""
    from gpuwarden.runners.infer.example_models import build_infer_example_assets
    from gpuwarden.runners.testing_models import build_example_assets

    if directory.exists() and not directory.is_dir():
        raise click.BadParameter(f"{directory} exists and is not a directory", param_hint="DIRECTORY")
    if not as_json:
        note(f"building tiny example models and data in {directory} …")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        built = {**build_example_assets(directory), **build_infer_example_assets(directory)}
    except OSError as exc:  # a folder that cannot be made or written, a full disk
        where = exc.filename or directory
        problem = f"cannot write the example models in {where}: {exc.strerror or exc}"
        raise UserError(f"{problem} — choose a folder you can write") from None
    if as_json:
        print_json({name: str(path) for name, path in built.items()})
        return
    for name, path in built.items():
        click.echo(f"{name:16} {path}")
