"""A real OpenSSH server on 127.0.0.1 and daemons in private worlds that play remote hosts.

sshd runs as the test's own user (`sshd -D -e -f CONFIG` on a free port, host and user keys made
by ssh-keygen): one sshd serves every "host", and each host is an alias of a test ssh config
whose `SetEnv GPUWARDEN_SOCKET=…` (accepted by the test sshd) makes `gpuwarden
status --socket` there name that host's daemon. The client side is set up as a user would:
`ssh.config` (GPUWARDEN_SSH__CONFIG) names the ssh config, `ssh.gpuwarden` the remote command.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests import preloaded
from tests.daemon.conftest import REPO, DaemonHandle

SSHD = Path("/usr/sbin/sshd")
START_TIMEOUT_S = 20.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@dataclass
class Sshd:
    """A running sshd and the ssh config whose aliases reach it."""

    root: Path
    port: int
    proc: subprocess.Popen[bytes]
    aliases: dict[str, str] = field(default_factory=dict)  # alias → the socket it names

    @property
    def ssh_config(self) -> Path:
        return self.root / "ssh_config"

    def alias(self, name: str, socket_path: Path) -> None:
        """Make `name` a host whose daemon listens on `socket_path`."""
        self.aliases[name] = str(socket_path)
        self._write_config()

    def _write_config(self) -> None:
        lines = [
            f"Host {' '.join(self.aliases) or 'none'}",
            "  HostName 127.0.0.1",
            f"  Port {self.port}",
            f"  User {os.environ.get('USER') or _user()}",
            f"  IdentityFile {self.root / 'user_key'}",
            "  IdentitiesOnly yes",
            "  StrictHostKeyChecking no",
            "  UserKnownHostsFile /dev/null",
            "  LogLevel ERROR",
        ]
        for name, path in self.aliases.items():
            lines += [f"Host {name}", f"  SetEnv GPUWARDEN_SOCKET={path}"]
        lines += ["Host gone", "  HostName 127.0.0.1", f"  Port {_free_port()}"]
        self.ssh_config.write_text("\n".join(lines) + "\n")

    def client_env(self) -> dict[str, str]:
        """What a user's settings would say: this ssh config, and how gpuwarden runs there."""
        remote = f"PYTHONPATH={shlex.quote(str(REPO))} {shlex.quote(sys.executable)} -m gpuwarden"
        return {"GPUWARDEN_SSH__CONFIG": str(self.ssh_config), "GPUWARDEN_SSH__GPUWARDEN": remote}


def ssh_processes(sshd: Sshd) -> list[psutil.Process]:
    """ssh clients started with the test's ssh config (by any gpuwarden of this test)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["name"] == "ssh" and str(sshd.ssh_config) in cmdline:
            found.append(proc)
    return found


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _sshd_config(root: Path, port: int) -> str:
    return "\n".join(
        [
            f"Port {port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {root / 'host_key'}",
            f"AuthorizedKeysFile {root / 'authorized_keys'}",
            "StrictModes no",
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "AllowStreamLocalForwarding yes",
            "AcceptEnv GPUWARDEN_SOCKET",
            "PidFile none",
            "",
        ]
    )


def sshd_missing() -> str | None:
    """Why no test sshd can run here (None: it can)."""
    if not SSHD.exists() or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "needs OpenSSH (apt-get install openssh-server openssh-client; .ci/run installs it)"
    return None


@contextlib.contextmanager
def started_sshd() -> Iterator[Sshd]:
    """sshd on 127.0.0.1 as this user, with its keys in a fresh folder; stopped (by pid) after."""
    if os.getuid() == 0:
        # sshd started by root insists on its privilege-separation folder, which the package's
        # service unit creates at boot and a container may not have.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="gws", dir="/tmp"))
    _keygen(root / "host_key")
    _keygen(root / "user_key")
    shutil.copy(root / "user_key.pub", root / "authorized_keys")
    port = _free_port()
    (root / "sshd_config").write_text(_sshd_config(root, port))
    log = (root / "sshd.log").open("wb")
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(root / "sshd_config")], stderr=log, stdout=log)
    log.close()
    server = Sshd(root, port, proc)
    try:
        _wait_listening(server)
        server._write_config()
        yield server
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def sshd() -> Iterator[Sshd]:
    """A real sshd; the test skips only where OpenSSH is not installed."""
    missing = sshd_missing()
    if missing:
        pytest.skip(missing)
    with started_sshd() as server:
        yield server


def _wait_listening(server: Sshd) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if server.proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {(server.root / 'sshd.log').read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", server.port), timeout=1):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"sshd did not listen in {START_TIMEOUT_S:.0f} s")
        time.sleep(0.05)


@dataclass
class World:
    """Daemons playing hosts reached through sshd, and a client environment to reach them."""

    sshd: Sshd
    hosts: dict[str, DaemonHandle]
    client_root: Path

    @property
    def env(self) -> dict[str, str]:
        """A user's shell on the client machine: its own (empty) gpuwarden folders, the ssh settings."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "XDG_"))}
        return {
            **base,
            "XDG_CONFIG_HOME": str(self.client_root / "config"),
            "XDG_STATE_HOME": str(self.client_root / "state"),
            "XDG_RUNTIME_DIR": str(self.client_root / "run"),
            "PYTHONPATH": str(REPO),
            **self.sshd.client_env(),
        }

    def cli_argv(self) -> list[str]:
        return [sys.executable, "-m", "gpuwarden"]

    def cli(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return preloaded.run(
            [*self.cli_argv(), *args],
            env=self.env,
            timeout=timeout,
            cwd=self.client_root,
        )


@contextlib.contextmanager
def started_world(sshd: Sshd, root: Path, hosts: dict[str, str]) -> Iterator[World]:
    """A daemon per host (`hosts`: name → fake GPUs) in its own folders under `root`, each host
    an alias of `sshd`'s config; stopped (and their runs killed) after."""
    handles: dict[str, DaemonHandle] = {}
    roots: list[Path] = []
    try:
        for name, gpus in hosts.items():
            runtime = Path(tempfile.mkdtemp(prefix="gw", dir="/tmp"))
            roots.append(runtime)
            (root / name).mkdir()
            handle = DaemonHandle(root / name, runtime, {"GPUWARDEN_FAKE_NVML": gpus})
            handles[name] = handle
            handle.start()
            sshd.alias(name, handle.socket)
        client_root = Path(tempfile.mkdtemp(prefix="gwc", dir="/tmp"))
        roots.append(client_root)
        (client_root / "run").mkdir(mode=0o700)
        yield World(sshd, handles, client_root)
    finally:
        for handle in handles.values():
            try:
                handle.stop()
            finally:
                handle.kill_runs()
        for folder in roots:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def world(sshd: Sshd, tmp_path: Path) -> Iterator[World]:
    """Hosts h1 (two fake H100s) and h2 (one fake A100), each its own daemon behind sshd."""
    with started_world(sshd, tmp_path, {"h1": "h100x2", "h2": "a100-80gb"}) as hosts:
        yield hosts
