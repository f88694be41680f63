"""`gpuwarden tui` and bare `gpuwarden`: choosing what the dashboard shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from gpuwarden.cli.main import cli, main
from gpuwarden.cli.tui import BROWSE, QUIT, START, choose_backend
from gpuwarden.core.errors import UserError
from tests.tui.fake_backend import FakeBackend

NOT_RUNNING = UserError("gpuwarden daemon is not running — start it with `gpuwarden up`", code="not_running")


class Daemon:
    """A daemon that is down until `start()` is called."""

    def __init__(self) -> None:
        self.up = False
        self.starts = 0

    def connect(self) -> Any:
        if not self.up:
            raise NOT_RUNNING
        return FakeBackend()

    def start(self) -> None:
        self.starts += 1
        self.up = True


def _choose(daemon: Daemon, answer: str | None, *, interactive: bool = True, db: Path | None = None,
            fallback: Path | None = None) -> tuple[Any, bool, list[str]]:  # fmt: skip
    asked: list[str] = []

    def ask(prompt: str, choices: list[str]) -> str:
        asked.append(prompt)
        assert answer in choices
        return answer

    opened: list[Path] = []

    def open_db(path: Path) -> Any:
        opened.append(path)
        return FakeBackend(controls=False)

    backend, readonly = choose_backend(
        db, interactive=interactive, connect=daemon.connect, open_db=open_db, ask=ask, start=daemon.start,
        fallback_db=fallback,
    )  # fmt: skip
    return backend, readonly, asked


def test_a_running_daemon_is_used_without_asking() -> None:
    daemon = Daemon()
    daemon.up = True
    _, readonly, asked = _choose(daemon, None)
    assert not readonly and not asked


def test_no_daemon_offers_to_start_one() -> None:
    daemon = Daemon()
    backend, readonly, asked = _choose(daemon, START)
    assert daemon.starts == 1 and not readonly and backend is not None
    assert "not running" in asked[0] and "[s] start" in asked[0] and "[b]" not in asked[0]


def test_no_daemon_offers_the_database_it_left(tmp_path: Path) -> None:
    db = tmp_path / "gpuwarden.db"
    db.write_bytes(b"")
    daemon = Daemon()
    _, readonly, asked = _choose(daemon, BROWSE, fallback=db)
    assert readonly and daemon.starts == 0 and str(db) in asked[0]


def test_quitting_and_scripts_get_the_one_line_error() -> None:
    with pytest.raises(click.exceptions.Abort):
        _choose(Daemon(), QUIT)
    with pytest.raises(UserError, match="not running"):
        _choose(Daemon(), None, interactive=False)


def test_db_flag_opens_the_database_read_only(tmp_path: Path) -> None:
    _, readonly, asked = _choose(Daemon(), None, db=tmp_path / "x.db")
    assert readonly and not asked


def test_bare_gpuwarden_without_a_terminal_prints_help() -> None:
    result = CliRunner().invoke(cli, [])
    assert result.exit_code == 0 and "Usage: " in result.output and "tui" in result.output


def test_tui_command_is_registered_with_its_flags() -> None:
    result = CliRunner().invoke(cli, ["tui", "--help"])
    assert result.exit_code == 0 and all(flag in result.output for flag in ("--db", "--readonly", "--log"))


def test_a_log_file_that_cannot_be_written_is_one_line_before_anything_opens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["tui", "--log", str(tmp_path / "missing" / "tui.log")])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("gpuwarden: --log ") and "No such file or directory" in line
    assert "directory you can write" in line
