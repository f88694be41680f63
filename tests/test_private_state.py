"""Owner-only state without a daemon process: folders that are not ours are refused (another user
played by an injected owner check, no root needed), modes are tightened whatever the umask,
relative config paths start from the config file's folder, and the instance lock outlives
`Daemon.close()`."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.core.config.settings import Settings, load_settings
from gpuwarden.core.errors import UserError
from gpuwarden.core.paths import Paths
from gpuwarden.core.private import OwnerOf, check_owner, ensure_private_dir, make_private, write_private_text
from gpuwarden.core.store.db import open_db
from gpuwarden.daemon.daemon import Daemon
from gpuwarden.daemon.lock import lock_holder_alive

OTHER_UID = os.getuid() + 4242


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def current_umask() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def owned_by_other(*paths: Path) -> OwnerOf:
    def owner(path: Path) -> int:
        return OTHER_UID if path in paths else path.stat().st_uid

    return owner


def test_private_dir_is_0700_even_when_it_existed_open(tmp_path: Path, loose_umask: None) -> None:
    folder = tmp_path / "a" / "b"
    folder.mkdir(parents=True, mode=0o755)
    ensure_private_dir(folder)
    assert mode(folder) == 0o700
    new = tmp_path / "new"
    ensure_private_dir(new)
    assert mode(new) == 0o700


def test_a_folder_of_another_user_is_refused_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    with pytest.raises(UserError) as caught:
        ensure_private_dir(folder, owned_by_other(folder), setting="paths.state_dir")
    message = caught.value.message
    assert "\n" not in message and str(folder) in message and f"uid {OTHER_UID}" in message
    assert "paths.state_dir" in message
    check_owner(tmp_path / "missing", owned_by_other())  # absent: nothing to refuse


def test_private_files_whatever_the_umask(tmp_path: Path, loose_umask: None) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("old")
    path.chmod(0o644)
    write_private_text(path, "name: x\n")
    assert mode(path) == 0o600 and path.read_text() == "name: x\n"
    loose = tmp_path / "loose.log"
    loose.write_text("x")
    loose.chmod(0o664)
    make_private(loose)
    assert mode(loose) == 0o600


def test_database_and_its_wal_files_are_owner_only(tmp_path: Path, loose_umask: None) -> None:
    db_path = tmp_path / "gpuwarden.db"
    db = open_db(db_path)
    db.execute("CREATE TABLE IF NOT EXISTS t (a)")
    db.execute("INSERT INTO t VALUES (1)")
    files = [db_path, tmp_path / "gpuwarden.db-wal", tmp_path / "gpuwarden.db-shm"]
    assert all(p.exists() for p in files)
    assert [mode(p) for p in files] == [0o600] * 3
    db.conn.close()
    db_path.chmod(0o644)  # as an older version left it
    open_db(db_path).conn.close()
    assert mode(db_path) == 0o600


@pytest.mark.parametrize("which", ["runtime_dir", "state_dir"])
def test_the_daemon_refuses_folders_of_another_user(tmp_path: Path, which: str) -> None:
    paths = Paths(state_dir=tmp_path / "state", runtime_dir=tmp_path / "run", db=tmp_path / "state" / "g.db")
    target = getattr(paths, which)
    target.mkdir(parents=True)
    daemon = Daemon(Settings(), paths, owner_of=owned_by_other(target))
    umask = current_umask()
    with pytest.raises(UserError) as caught:
        daemon.start()
    os.umask(umask)  # start() had switched to the owner-only umask before refusing
    assert "\n" not in caught.value.message and f"paths.{which}" in caught.value.message
    assert not paths.lock_file.exists() or not lock_holder_alive(paths.lock_file)


def test_relative_config_paths_start_at_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    cfg = cfg_dir / "config.yaml"
    cfg.write_text("paths:\n  state_dir: state\n  db: ../data/g.db\n  runtime_dir: ~/run\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    settings = load_settings(cfg, environ={})
    assert settings.paths.state_dir == cfg_dir / "state"
    assert settings.paths.db == cfg_dir / "../data/g.db"
    assert str(settings.paths.runtime_dir) == "~/run"  # expanded later, like any home path
    # A relative value from a variable starts where the command runs.
    from_env = load_settings(cfg, environ={"GPUWARDEN_PATHS__STATE_DIR": "here"})
    assert from_env.paths.state_dir == elsewhere / "here"
    assert from_env.resolve_paths().state_dir.is_absolute()


def test_close_keeps_the_instance_lock_until_the_process_exits(tmp_path: Path) -> None:
    from gpuwarden.core.telemetry.nvml import open_gpu_reader

    paths = Paths(state_dir=tmp_path / "state", runtime_dir=tmp_path / "run", db=tmp_path / "state" / "g.db")
    daemon = Daemon(Settings(), paths, gpu_reader=open_gpu_reader("h100"))
    umask = current_umask()
    daemon.start()
    try:
        assert os.umask(0o077) == 0o077  # the daemon's own umask while it runs
    finally:
        daemon.close()
    assert os.umask(umask) == umask  # restored by close()
    # A second daemon must not start beside one that is still winding down: the lock goes with
    # the process, not with close().
    assert lock_holder_alive(paths.lock_file)
    daemon.lock.release()
    daemon.db_lock.release()
    assert not lock_holder_alive(paths.lock_file)
    assert mode(paths.state_dir) == 0o700 and mode(paths.runs_dir) == 0o700 and mode(paths.db) == 0o600
