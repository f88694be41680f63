"""The controls of a backend that only reads (a database copy, cluster run folders): each one is
refused with the backend's own one-line reason."""

from __future__ import annotations

from typing import Any

from gpuwarden.core.errors import UserError


class ReadOnlyControls:
    """Every control refused with `_readonly()`: what is open read-only, and where to act instead."""

    def _readonly(self) -> UserError:
        raise NotImplementedError

    def stop_run(self, run_id: str) -> None:
        raise self._readonly()

    def resume_run(self, run_id: str) -> None:
        raise self._readonly()

    def submit(self, spec_path: str) -> str:
        raise self._readonly()

    def rerun(self, run_id: str, typed: dict[str, Any]) -> str:
        raise self._readonly()

    def restart_with(self, run_id: str, changes: dict[str, Any]) -> None:
        raise self._readonly()

    def tune(self, run_id: str) -> None:
        raise self._readonly()

    def kill_process(self, pid: int) -> None:
        raise self._readonly()
