"""Where gpuwarden keeps things (XDG through platformdirs), resolved once from the settings.

Tests point everything at a temporary directory by setting XDG_* variables (or
GPUWARDEN_CONFIG), never by patching.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP = "gpuwarden"


def default_config_file() -> Path:
    env = os.environ.get("GPUWARDEN_CONFIG")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_config_dir(APP, appauthor=False)) / "config.yaml"


def default_state_dir() -> Path:
    return Path(platformdirs.user_state_dir(APP, appauthor=False))


def default_runtime_dir() -> Path:
    """`$XDG_RUNTIME_DIR/gpuwarden`; without XDG_RUNTIME_DIR (root shells, containers) a private
    directory under the state dir, since /run/user/<uid> may not exist there."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / APP
    return default_state_dir() / "run"


def default_paths() -> Paths:
    """Where everything is when no setting moves it (the settings' `resolve_paths` with every
    path left out)."""
    state = default_state_dir()
    return Paths(state_dir=state, runtime_dir=default_runtime_dir(), db=state / "gpuwarden.db")


@dataclass(frozen=True)
class Paths:
    """Resolved locations for one daemon instance."""

    state_dir: Path
    runtime_dir: Path
    db: Path

    @property
    def runs_dir(self) -> Path:
        return self.state_dir / "runs"

    def run_dir(self, run_id: str) -> Path:
        """Where run `run_id` keeps its files."""
        return self.runs_dir / run_id

    @property
    def socket(self) -> Path:
        return self.runtime_dir / "api.sock"

    @property
    def lock_file(self) -> Path:
        return self.runtime_dir / "daemon.lock"

    @property
    def pid_file(self) -> Path:
        return self.runtime_dir / "daemon.pid"

    @property
    def daemon_log(self) -> Path:
        return self.state_dir / "daemon.log"

    @property
    def tune_cache(self) -> Path:
        return self.state_dir / "tuned"
