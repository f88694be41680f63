"""A run's spec as a command line gives it: a spec file, or a program with `run`'s options."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from gpuwarden.cli.command_spec import FLAGS_LABEL, command_document, flags_spec, printable_spec
from gpuwarden.cli.runs_cmds import spec_given
from gpuwarden.core.config.resolve import resolve_relative_paths
from gpuwarden.core.config.spec import RunSpec, spec_from_document
from gpuwarden.core.config.yamlsource import parse_yaml, read_yaml_text
from gpuwarden.core.errors import UserError
from gpuwarden.core.safeload import SPEC_FILE_LIMITS


def spec_of(
    words: tuple[str, ...], flags: dict[str, Any], command: str, nodes: int | None = None
) -> tuple[RunSpec, str | None, str]:
    """(the spec, its file's text when it came from one, the label its messages use), its
    relative paths resolved as `gpuwarden run` resolves them. `--print-spec` prints a command's
    spec and exits. `nodes` (a `--nodes` flag) sets `resources.nodes` where the spec does not."""
    if spec_given(words, flags, command):
        path = Path(words[0])
        text = read_yaml_text(path, SPEC_FILE_LIMITS)
        document = parse_yaml(text, str(path))
        _set_nodes(document.data, nodes, str(path))
        with document.locating(RunSpec.model_fields):
            spec = resolve_relative_paths(spec_from_document(document), path.resolve().parent)
        return spec, text, str(path)
    flags_document = command_document(list(words), Path.cwd(), **flags)
    _set_nodes(flags_document, nodes, FLAGS_LABEL)
    if flags["print_spec"]:
        click.echo(printable_spec(flags_document), nl=False)
        sys.exit(0)
    return flags_spec(flags_document), None, FLAGS_LABEL


def _set_nodes(document: dict[str, Any], nodes: int | None, label: str) -> None:
    """`--nodes N` as the spec's `resources.nodes`; a spec that names another count is refused
    (before validation, so `resources.gpus` is checked against the machines the run will have)."""
    if nodes is None:
        return
    resources = document.get("resources")
    if resources is None:
        document["resources"] = {"nodes": nodes}
        return
    if not isinstance(resources, dict):
        return  # validation says what is wrong with it
    given = resources.get("nodes")
    if given is not None and given != nodes:
        raise UserError(f"--nodes {nodes}, and {label} sets resources.nodes: {given} — make them agree")
    resources["nodes"] = nodes
