"""One OpenSSH connection to a host, with its daemon's Unix socket forwarded to a local one.

The user's own `ssh` does everything (its config, keys, agent, ProxyJump): a master connection
(`-N -o ControlMaster=yes`) logs in once; through it `gpuwarden status --socket` asks the host
where its daemon listens, and `-O forward -L LOCAL:REMOTE` forwards that socket to LOCAL, a socket
in the user's private runtime folder (0700, the socket itself 0600). Nothing listens on the
network, and the daemon's socket is reached as its owner, so no second authentication is needed.
Every wait is bounded; every failure is one line (`ssh: connect timed out`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.core.config.hosts import SshSettings
from gpuwarden.core.errors import UserError

# What ssh says on stderr → the line shown in the host's place.
_SSH_SAYS = (
    ("timed out", "ssh: connect timed out"),
    ("Connection refused", "ssh: connection refused (no sshd there?)"),
    ("Could not resolve hostname", "ssh: unknown host (neither in DNS nor in your ssh config)"),
    ("Permission denied", "ssh: the key was refused — add it there (ssh-copy-id) or to your ssh-agent"),
    ("Host key verification failed", "ssh: host key not known or changed — check it with a plain `ssh HOST`"),
    ("No route to host", "ssh: no route to host"),
    ("Network is unreachable", "ssh: network unreachable"),
)
NOT_INSTALLED = 127  # the shell's status for a command it could not find
_names = itertools.count()


@dataclass(frozen=True)
class SshCommand:
    """The ssh invocation every call to every host shares, from the `ssh:` settings."""

    argv: tuple[str, ...]
    connect_timeout_s: float
    read_timeout_s: float
    gpuwarden: str

    @classmethod
    def of(cls, settings: SshSettings) -> SshCommand:
        config = ("-F", str(settings.config.expanduser())) if settings.config else ()
        return cls(
            argv=(settings.command, *config, *settings.options),
            connect_timeout_s=settings.connect_timeout_s,
            read_timeout_s=settings.read_timeout_s,
            gpuwarden=settings.gpuwarden,
        )

    @property
    def login_deadline_s(self) -> float:
        """How long a login may take in all: the TCP connect, then key exchange and auth."""
        return 2 * self.connect_timeout_s + 2


def ssh_failure(stderr: str) -> str:
    """ssh's complaint as one line in our words (its own last line when we do not know it)."""
    for said, line in _SSH_SAYS:
        if said in stderr:
            return line
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return f"ssh: {lines[-1]}" if lines else "ssh: the connection ended"


class SshTunnel:
    """A master ssh process to `host` forwarding its daemon's socket; `open` returns the local one.

    Started in this process's group, so a Ctrl-C on the terminal ends it too; `close` ends it by pid.
    """

    def __init__(
        self,
        host: str,
        ssh: SshCommand,
        folder: Path,
        spawn: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
    ) -> None:
        self.host = host
        self.ssh = ssh
        stem = f"{os.getpid()}-{next(_names)}"
        self.control = folder / f"{stem}.ctl"
        self.local = folder / f"{stem}.sock"
        self.remote: Path | None = None
        self._spawn = spawn
        self._master: subprocess.Popen[bytes] | None = None

    def open(self, remote: Path | None = None) -> Path:
        """Log in, find the daemon's socket there (unless `remote` says where it was last time),
        forward it; the local socket. UserError when any step fails, with the tunnel closed."""
        try:
            self._start_master()
            self.remote = remote or self._remote_socket()
            self._forward(self.remote)
        except BaseException:
            self.close()
            raise
        return self.local

    def ask_again(self) -> Path:
        """Ask the host where its daemon listens now (a remembered socket had none) and forward
        that one instead, on the same local socket."""
        remote = self._remote_socket()
        if remote != self.remote and self.remote is not None:
            self._through_master("-O", "cancel", "-L", f"{self.local}:{self.remote}", self.host)
            self.local.unlink(missing_ok=True)
            self.remote = remote
            self._forward(remote)
        return remote

    def alive(self) -> bool:
        return self._master is not None and self._master.poll() is None

    def close(self) -> None:
        master, self._master = self._master, None
        if master is not None:
            if master.poll() is None:
                master.terminate()
                try:
                    master.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    master.kill()
                    master.wait()
            if master.stderr is not None:
                master.stderr.close()
        for path in (self.control, self.local):
            with contextlib.suppress(OSError):
                path.unlink()

    # -- the steps ---------------------------------------------------------------------------------

    def _options(self) -> list[str]:
        return [
            *self.ssh.argv,
            "-o", "BatchMode=yes",  # never a password prompt in the middle of a table
            "-o", f"ConnectTimeout={max(1, round(self.ssh.connect_timeout_s))}",
            "-o", f"ControlPath={self.control}",
        ]  # fmt: skip

    def _start_master(self) -> None:
        argv = [
            *self._options(),
            "-N",
            "-o", "ControlMaster=yes",
            "-o", "ControlPersist=no",
            "-o", "ExitOnForwardFailure=yes",
            "-o", "StreamLocalBindUnlink=yes",
            "-o", "StreamLocalBindMask=0177",
            # A host that vanishes (powered off, network gone) is noticed in 10 s, not hours.
            "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=2",
            self.host,
        ]  # fmt: skip
        try:
            self._master = self._spawn(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
        except OSError as exc:
            raise UserError(
                f"cannot run {self.ssh.argv[0]} ({exc.strerror or exc}) — install the OpenSSH client "
                "or set ssh.command to it",
                code="ssh",
            ) from None
        deadline = time.monotonic() + self.ssh.login_deadline_s
        # The master makes its control socket once logged in.
        while not self.control.exists():
            if self._master.poll() is not None:
                assert self._master.stderr is not None
                raise UserError(ssh_failure(self._master.stderr.read().decode(errors="replace")), code="ssh")
            if time.monotonic() > deadline:
                raise UserError(f"ssh: no login within {self.ssh.login_deadline_s:.0f} s", code="ssh")
            time.sleep(0.02)

    def _through_master(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [*self._options(), "-o", "ControlMaster=no", *args]
        try:
            return subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.ssh.read_timeout_s,
            )
        except subprocess.TimeoutExpired:
            raise UserError(f"ssh: no answer within {self.ssh.read_timeout_s:.0f} s", code="ssh") from None

    def _remote_socket(self) -> Path:
        """Where the host's daemon listens, as gpuwarden there decides it (its settings, its
        XDG_RUNTIME_DIR, its GPUWARDEN_SOCKET)."""
        done = self._through_master(self.host, f"{self.ssh.gpuwarden} status --socket")
        if done.returncode == NOT_INSTALLED:
            raise UserError(
                f"`{self.ssh.gpuwarden}` is not found there — install gpuwarden on that host, or set "
                "ssh.gpuwarden to its path (e.g. ~/.venv/bin/gpuwarden)",
                code="not_installed",
            )
        said = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        if done.returncode != 0 or not said or not said[-1].startswith("/"):
            why = [line for line in done.stderr.splitlines() if line.strip()]
            raise UserError(
                f"`{self.ssh.gpuwarden} status --socket` failed there: {why[-1] if why else 'no answer'}",
                code="remote",
            )
        return Path(said[-1])

    def _forward(self, remote: Path) -> None:
        done = self._through_master("-O", "forward", "-L", f"{self.local}:{remote}", self.host)
        if done.returncode != 0:
            raise UserError(f"ssh could not forward {remote}: {ssh_failure(done.stderr)}", code="ssh")
