"""A LightningCLI config composed of several files: `fit --config base.yaml --config exp.yaml`,
each later file over the ones before it.

The run's config file (`--config-file exp.yaml`) is the one whose copy each attempt gets, but the
batch size may live in an earlier one. The framework's keys are read from those too, and a retune
writes its value into the copy of the run's file, which LightningCLI reads last — so only when
that file is the last `--config`; a file after it would override what its copy changes.
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.core.command.config_file import ConfigDocument, load_config
from gpuwarden.core.errors import UserError

_FLAGS = ("--config", "-c")


def config_args(argv: list[str]) -> list[str]:
    """The files `argv` hands LightningCLI as `--config F`, `-c F` or `--config=F`, in order."""
    found = []
    for i, item in enumerate(argv):
        if item in _FLAGS and i + 1 < len(argv):
            found.append(argv[i + 1])
        elif item.startswith("--config="):
            found.append(item.partition("=")[2])
    return found


def earlier_configs(argv: list[str], cwd: Path, named: Path) -> list[ConfigDocument]:
    """The config files given before `named`, first to last, when `named` is the last one; none
    otherwise. One that cannot be read is left for the program to say so."""
    # A completed spec names the run's file by its placeholder: it is that file's copy.
    paths = [
        named.resolve() if arg == "{config_file}" else (cwd / arg).resolve() for arg in config_args(argv)
    ]
    if len(paths) < 2 or paths[-1] != named.resolve():
        return []
    documents = []
    for path in paths[:-1]:
        try:
            documents.append(load_config(path))
        except UserError:
            continue
    return documents
