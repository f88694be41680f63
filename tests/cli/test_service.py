"""`gpuwarden service install|uninstall` against a recording fake `systemctl`/`loginctl` on PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import preloaded


def _fake_tools(bin_dir: Path, log: Path, linger: str) -> None:
    bin_dir.mkdir()
    for tool, out in (("systemctl", ""), ("loginctl", linger)):
        script = bin_dir / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\nprintf "{out}\\n"\n')
        script.chmod(0o755)


def _run(
    tmp_path: Path, *args: str, path: str, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": path,
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    env.pop("GPUWARDEN_CONFIG", None)
    env.update(extra or {})
    return preloaded.run([sys.executable, "-m", "gpuwarden", "service", *args], env=env, timeout=60)


@pytest.fixture
def fake_bin(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "calls.log"
    _fake_tools(tmp_path / "bin", log, linger="no")
    return tmp_path / "bin", log


def test_install_writes_unit_enables_it_and_warns_about_lingering(
    tmp_path: Path, fake_bin: tuple[Path, Path]
) -> None:
    bin_dir, log = fake_bin
    if Path("/var/lib/systemd/linger").exists() and any(Path("/var/lib/systemd/linger").iterdir()):
        pytest.skip("this machine has lingering users; the linger file check would short-circuit")
    r = _run(tmp_path, "install", path=f"{bin_dir}:/usr/bin:/bin")
    assert r.returncode == 0, r.stderr
    unit = tmp_path / "config" / "systemd" / "user" / "gpuwarden.service"
    text = unit.read_text()
    assert f"ExecStart={sys.executable} -P -m gpuwarden daemon" in text
    assert "Restart=on-failure" in text and "KillMode=mixed" in text
    assert "WantedBy=default.target" in text
    # the unit must read the same config/state as the shell that installed it
    assert f"Environment=XDG_STATE_HOME={tmp_path / 'state'}" in text
    calls = log.read_text().splitlines()
    assert "systemctl --user daemon-reload" in calls
    assert "systemctl --user enable --now gpuwarden.service" in calls
    assert "lingering is off" in r.stderr and "loginctl enable-linger" in r.stderr


def test_install_json_and_uninstall(tmp_path: Path, fake_bin: tuple[Path, Path]) -> None:
    bin_dir, log = fake_bin
    r = _run(tmp_path, "install", "--no-start", "--json", path=f"{bin_dir}:/usr/bin:/bin")
    out = json.loads(r.stdout)
    assert out["unit"].endswith("systemd/user/gpuwarden.service")
    assert "systemctl --user enable gpuwarden.service" in log.read_text()
    r = _run(tmp_path, "uninstall", "--json", path=f"{bin_dir}:/usr/bin:/bin")
    assert r.returncode == 0
    assert not Path(out["unit"]).exists()
    assert "systemctl --user disable --now gpuwarden.service" in log.read_text()


def test_install_without_systemctl_still_writes_the_unit(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _run(tmp_path, "install", path=str(empty))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "config" / "systemd" / "user" / "gpuwarden.service").exists()
    assert "systemctl is not available here" in r.stderr
    assert "Traceback" not in r.stderr


def test_install_where_no_user_manager_answers_says_what_starts_the_daemon(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"  # what systemctl says in a container or under `su`
    systemctl.write_text(
        '#!/bin/sh\necho "Failed to connect to bus: No such file or directory" >&2\nexit 1\n'
    )
    systemctl.chmod(0o755)
    r = _run(tmp_path, "install", path=f"{bin_dir}:/usr/bin:/bin")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "config" / "systemd" / "user" / "gpuwarden.service").exists()
    assert "Failed to connect to bus" in r.stderr and "not enabled" in r.stderr
    assert "`gpuwarden up`" in r.stderr and "Traceback" not in r.stderr


def test_the_unit_keeps_the_settings_the_installing_shell_gives_by_variable(
    tmp_path: Path, fake_bin: tuple[Path, Path]
) -> None:
    bin_dir, _ = fake_bin
    extra = {"GPUWARDEN_SAMPLE_INTERVAL": "5", "GPUWARDEN_SOCKET": str(tmp_path / "elsewhere.sock")}
    r = _run(tmp_path, "install", "--no-start", path=f"{bin_dir}:/usr/bin:/bin", extra=extra)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "config" / "systemd" / "user" / "gpuwarden.service").read_text()
    assert "Environment=GPUWARDEN_SAMPLE_INTERVAL=5" in text  # as `gpuwarden up` would sample
    assert "GPUWARDEN_SOCKET" not in text  # where clients connect, not a setting of the daemon


def test_install_makes_a_missing_config_home_0700(tmp_path: Path, fake_bin: tuple[Path, Path]) -> None:
    """The XDG Base Directory spec: a base folder a program creates is created 0700; so is each
    folder gpuwarden makes on the way to the unit. One that exists is left as it is."""
    bin_dir, _ = fake_bin
    kept = tmp_path / "kept"
    kept.mkdir()
    kept.chmod(0o755)
    home = kept / "made" / "config"
    extra = {"XDG_CONFIG_HOME": str(home)}
    r = _run(tmp_path, "install", "--no-start", path=f"{bin_dir}:/usr/bin:/bin", extra=extra)
    assert r.returncode == 0, r.stderr
    made = [home.parent, home, home / "systemd", home / "systemd" / "user"]
    modes = {str(p): oct(p.stat().st_mode & 0o777) for p in [kept, *made]}
    assert modes == {str(kept): "0o755", **{str(p): "0o700" for p in made}}
