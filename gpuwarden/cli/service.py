"""`gpuwarden service install|uninstall`: a systemd user unit for the daemon."""

from __future__ import annotations

import os

import click

from gpuwarden.cli.format import note, print_json
from gpuwarden.core.private import make_dirs
from gpuwarden.daemon.systemd import UNIT_NAME, linger_state, systemctl, unit_path, unit_text

# Settings that must follow the daemon into the unit, or it would read another config/state.
# XDG_RUNTIME_DIR is systemd's own to set; GPUWARDEN_SOCKET only tells clients where to connect.
_CARRIED_ENV = ("XDG_CONFIG_HOME", "XDG_STATE_HOME")
_NOT_CARRIED = ("GPUWARDEN_SOCKET",)


def _carried(name: str) -> bool:
    """The config and state locations, and every GPUWARDEN_* setting (`GPUWARDEN_SAMPLE_INTERVAL`
    is as much the daemon's configuration as the file is: `gpuwarden up` would use it)."""
    if name in _NOT_CARRIED:
        return False
    return name in _CARRIED_ENV or name.startswith("GPUWARDEN_")


@click.group()
def service() -> None:
    """Install or remove the systemd user unit that keeps the daemon running."""


@service.command()
@click.option("--no-start", is_flag=True, help="Write and enable the unit but do not start it now.")
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
def install(no_start: bool, as_json: bool) -> None:
    """Write ~/.config/systemd/user/gpuwarden.service, enable it and start it."""
    path = unit_path()
    make_dirs(path.parent)
    env = {k: v for k, v in os.environ.items() if _carried(k)}
    path.write_text(unit_text(environment=env))
    steps: list[str] = [f"wrote {path}"]
    warnings: list[str] = []
    reload = systemctl("daemon-reload")
    if reload is None:
        warnings.append(
            f"systemctl is not available here: enable the unit yourself with "
            f"`systemctl --user enable --now {UNIT_NAME}`"
        )
    elif reload.returncode != 0:
        # Typically no user manager answers (a container, `su`, an SSH session without a login
        # session): the unit is on disk but nothing will start it, so say what will.
        warnings.append(
            f"systemctl --user daemon-reload failed: {_first_line(reload.stderr)} — the unit is written"
            f" but not enabled: where your systemd user manager runs, `systemctl --user enable --now"
            f" {UNIT_NAME}`; without one, start the daemon with `gpuwarden up`"
        )
    else:
        args = ["enable", UNIT_NAME] if no_start else ["enable", "--now", UNIT_NAME]
        done = systemctl(*args)
        if done is not None and done.returncode == 0:
            steps.append("enabled" + ("" if no_start else " and started") + f" {UNIT_NAME}")
        elif done is not None:
            warnings.append(f"systemctl --user {' '.join(args)} failed: {_first_line(done.stderr)}")
    linger = linger_state()
    if linger.enabled is False:
        warnings.append(
            f"lingering is off for {linger.user}: the daemon stops when your last SSH session ends — "
            f"run `loginctl enable-linger {linger.user}`"
        )
    elif linger.enabled is None:
        warnings.append(
            "could not tell whether lingering is on; without it the daemon stops at logout — "
            f"check `loginctl show-user {linger.user} --property=Linger`"
        )
    if as_json:
        print_json({"unit": str(path), "steps": steps, "warnings": warnings, "linger": linger.enabled})
        return
    for s in steps:
        click.echo(s)
    for w in warnings:
        note(f"warning: {w}")


@service.command()
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
def uninstall(as_json: bool) -> None:
    """Stop and disable the unit and remove its file (runs keep running)."""
    path = unit_path()
    steps: list[str] = []
    warnings: list[str] = []
    if systemctl("disable", "--now", UNIT_NAME) is None:
        warnings.append("systemctl is not available here: nothing to stop")
    else:
        steps.append(f"disabled and stopped {UNIT_NAME}")
    if path.exists():
        path.unlink()
        steps.append(f"removed {path}")
        systemctl("daemon-reload")
    else:
        steps.append(f"no unit file at {path}")
    if as_json:
        print_json({"unit": str(path), "steps": steps, "warnings": warnings})
        return
    for s in steps:
        click.echo(s)
    for w in warnings:
        note(f"warning: {w}")


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or ["(no message)"])[0]
