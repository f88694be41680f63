"""`--host HOST…` / `--all-hosts`: which daemons a command reads, and the fleet that reaches them.

Nothing said: the local daemon, as always. `--host` is repeatable and takes comma lists
(`--host gpu1,gpu2 --host local`); `--all-hosts` takes the config's `hosts:` list. `history`
has its own `--host` flag (the host's metrics), so there the option is `-H`/`--on`; `-H` is the
short form everywhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from gpuwarden.core.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:
    from gpuwarden.client.hosts import Fleet
    from gpuwarden.client.reader import RunReader


def hosts_option(fn: F, *, long_host: bool = True) -> F:
    """Add `--host/-H HOST` (`-H/--on` where `--host` is taken; repeatable, comma lists) and
    `--all-hosts` to a command."""
    names = ["--host", "-H"] if long_host else ["-H", "--on"]
    fn = click.option(
        "--all-hosts",
        is_flag=True,
        help="Every host of the config's `hosts:` list.",
    )(fn)
    return click.option(
        *names,
        "hosts",
        multiple=True,
        metavar="HOST",
        help="The daemon on HOST, over ssh (`local`: this one's). Repeatable, or a comma list.",
    )(fn)


def history_hosts_option(fn: F) -> F:
    return hosts_option(fn, long_host=False)


def chosen_hosts(hosts: tuple[str, ...], all_hosts: bool) -> list[str]:
    """The hosts named (`--host`), then the config's (`--all-hosts`); [] for the local daemon alone."""
    if not hosts and not all_hosts:
        return []  # the common case answers without loading the settings' models
    from gpuwarden.core.config.hosts import host_list

    names = host_list(hosts)
    if all_hosts:
        from gpuwarden.core.config.settings import load_settings

        listed = load_settings().hosts
        if not listed:
            from gpuwarden.core.paths import default_config_file

            raise UserError(
                f"no hosts listed in {default_config_file()} — add `hosts: [gpu1, gpu2]` there, "
                "or name them with --host"
            )
        names += [name for name in listed if name not in names]
    return names


@contextlib.contextmanager
def fleet(names: list[str]) -> Iterator[Fleet]:
    """The hosts' links, closed (their ssh processes ended) when the command is done."""
    from gpuwarden.client.hosts import Fleet
    from gpuwarden.client.ssh_forward import SshCommand
    from gpuwarden.core.config.settings import load_settings

    settings = load_settings()
    with Fleet(names, SshCommand.of(settings.ssh), settings.resolve_paths().runtime_dir) as hosts:
        yield hosts


@contextlib.contextmanager
def reading_run(runs_dir: Path | None, names: list[str], run: str) -> Iterator[RunReader]:
    """Where `show` and `logs` read run `run`: the host among `names` that owns it, else as
    `reading` decides (the local daemon, or `--runs DIR`)."""
    if not names:
        from gpuwarden.cli.run_source import reading

        with reading(runs_dir) as client:
            yield client
        return
    if runs_dir is not None:
        raise UserError("--runs reads run folders here and --host the daemons there: give one of them")
    from gpuwarden.client.host_reader import owner_of

    with fleet(names) as hosts:
        yield owner_of(hosts, run)


def host_field(reader: RunReader) -> dict[str, str]:
    """`{"host": NAME}` for a run read on a named host (its JSON says where), else nothing."""
    from gpuwarden.client.host_reader import HostReader

    return {"host": reader.host} if isinstance(reader, HostReader) else {}
