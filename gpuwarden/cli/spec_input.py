"""A run's spec as a command line gives it: a spec file, or a program with `run`'s options."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from gpuwarden.cli.command_spec import command_document, printable_spec
from gpuwarden.cli.runs_cmds import spec_given
from gpuwarden.core.config.resolve import resolve_relative_paths
from gpuwarden.core.config.spec import RunSpec, spec_from_document, spec_from_mapping
from gpuwarden.core.config.yamlsource import parse_yaml, read_yaml_text
from gpuwarden.core.safeload import SPEC_FILE_LIMITS


def spec_of(words: tuple[str, ...], flags: dict[str, Any], command: str) -> tuple[RunSpec, str | None, str]:
    """(the spec, its file's text when it came from one, the label its messages use), its
    relative paths resolved as `gpuwarden run` resolves them. `--print-spec` prints a command's
    spec and exits."""
    if spec_given(words, flags, command):
        path = Path(words[0])
        text = read_yaml_text(path, SPEC_FILE_LIMITS)
        document = parse_yaml(text, str(path))
        with document.locating(RunSpec.model_fields):
            spec = resolve_relative_paths(spec_from_document(document), path.resolve().parent)
        return spec, text, str(path)
    flags_document = command_document(list(words), Path.cwd(), **flags)
    if flags["print_spec"]:
        click.echo(printable_spec(flags_document), nl=False)
        sys.exit(0)
    return spec_from_mapping(flags_document, label="the flags"), None, "the flags"
