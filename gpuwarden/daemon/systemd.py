"""The systemd user unit for the daemon, and the checks that make it survive an SSH logout.

KillMode=mixed: `systemctl stop` sends SIGTERM to the daemon alone (it shuts down cleanly) and
SIGKILL only to what is left in the daemon's own cgroup. Runs are launched into scopes of their
own (`systemd-run --user --scope`) when the daemon runs under systemd (`daemon/process.py`,
`in_own_scope`), so neither a stop nor a crash with Restart=on-failure takes a run down with the
daemon; the restarted daemon re-adopts them.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import platformdirs

UNIT_NAME = "gpuwarden.service"


def unit_path() -> Path:
    return Path(platformdirs.user_config_dir("systemd", appauthor=False)) / "user" / UNIT_NAME


def unit_text(python: str | None = None, environment: dict[str, str] | None = None) -> str:
    """The unit file; ExecStart uses this interpreter so a venv install keeps working."""
    exe = python or sys.executable
    env_lines = "".join(
        f"Environment={shlex.quote(f'{k}={v}')}\n" for k, v in sorted((environment or {}).items())
    )
    return (
        "[Unit]\n"
        "Description=gpuwarden daemon: GPU telemetry and run supervisor\n"
        "After=default.target\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={shlex.quote(exe)} -P -m gpuwarden daemon\n"  # -P: never a gpuwarden/ in its cwd
        f"{env_lines}"
        "Restart=on-failure\n"
        "RestartSec=2\n"
        "KillMode=mixed\n"
        "TimeoutStopSec=30\n"
        "\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


@dataclass(frozen=True)
class LingerState:
    enabled: bool | None  # None: could not tell
    user: str


def linger_state() -> LingerState:
    """Whether systemd keeps this user's services after the last session ends."""
    user = pwd.getpwuid(os.getuid()).pw_name
    if Path("/var/lib/systemd/linger", user).exists():
        return LingerState(True, user)
    loginctl = shutil.which("loginctl")
    if loginctl is None:
        return LingerState(None, user)
    try:
        out = subprocess.run(
            [loginctl, "show-user", user, "--property=Linger", "--value"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return LingerState(None, user)
    value = out.stdout.strip()
    if out.returncode != 0 or value not in ("yes", "no"):
        return LingerState(None, user)
    return LingerState(value == "yes", user)


def systemctl(*args: str) -> subprocess.CompletedProcess[str] | None:
    """Run `systemctl --user ARGS`; None when systemctl is not on this machine."""
    exe = shutil.which("systemctl")
    if exe is None:
        return None
    return subprocess.run([exe, "--user", *args], capture_output=True, text=True, timeout=30)
