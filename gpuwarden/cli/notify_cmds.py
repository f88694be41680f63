"""`gpuwarden notify test`: one message to every target `notify:` names, each target's result.

It runs here, in the CLI's process, on the settings the daemon reads (the same file and
GPUWARDEN_* variables): it works with no daemon running, and shows what this machine can reach.
"""

from __future__ import annotations

import socket
import sys
import time

import click

from gpuwarden.cli.format import print_json
from gpuwarden.core.errors import UserError


@click.group()
def notify() -> None:
    """Notifications: where the daemon tells what happens to runs (`notify:` in the config)."""


@notify.command("test")
@click.option("--json", "as_json", is_flag=True, help="Print each target's result as JSON.")
def test_cmd(as_json: bool) -> None:
    """Send one test message to every configured target; exit status 1 if any failed."""
    from gpuwarden.core.config.settings import load_settings
    from gpuwarden.core.notify.notice import Notice
    from gpuwarden.core.paths import default_config_file
    from gpuwarden.daemon.notify.targets import SendFailed, build_targets

    settings = load_settings().notify
    if not settings.configured:
        raise UserError(
            f"no notification targets: add notify.urls or notify.on_event to {default_config_file()} "
            "(see docs/fleet.md)"
        )
    host = socket.gethostname()
    notice = Notice(
        "test",
        f"gpuwarden on {host}: test notification",
        f"This is a test from `gpuwarden notify test` on {host}: notifications reach you here.",
        host,
        time.time(),
    )
    results: list[dict[str, object]] = []
    for target in build_targets(settings):
        try:
            target.send(notice)
            results.append({"target": target.label, "ok": True, "error": None})
        except SendFailed as exc:
            results.append({"target": target.label, "ok": False, "error": str(exc)})
    if as_json:
        print_json({"targets": results})
    else:
        for row in results:
            click.echo(
                f"{'ok' if row['ok'] else 'failed':<7} {row['target']}"
                + (f": {row['error']}" if row["error"] else "")
            )
    if not all(row["ok"] for row in results):
        sys.exit(1)
