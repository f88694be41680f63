"""Where the run commands read runs from: the daemon, or run folders (`--runs DIR`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from gpuwarden.client import ApiClient
    from gpuwarden.client.reader import RunReader

F = TypeVar("F", bound=Callable[..., Any])


def runs_option(fn: F) -> F:
    """`--runs DIR`: read the run folders in DIR (what `gpuwarden exec` keeps), not the daemon."""
    option = click.option(
        "--runs",
        "runs_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Read the run folders in DIR (gpuwarden exec's, in a cluster job), not the daemon.",
    )
    return option(fn)


@contextlib.contextmanager
def reading(runs_dir: Path | None) -> Iterator[RunReader]:
    """The run folders in `runs_dir` when given, else the daemon."""
    if runs_dir is not None:
        from gpuwarden.client.run_folders import RunFolders

        yield RunFolders(runs_dir)
        return
    with daemon_client() as client:
        yield client


def daemon_client() -> ApiClient:
    """A client of the daemon, its HTTP library loaded only by the commands that talk to it."""
    from gpuwarden.client import ApiClient

    return ApiClient()
