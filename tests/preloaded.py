"""`gpuwarden ARGS…` as a process forked from an interpreter that has imported gpuwarden once
(`tests/preload_server.py` says why and how), with `subprocess`'s shapes: `run` returns a
`CompletedProcess`, `popen` a process with `pid`, `poll`, `wait`, `send_signal`, `kill`.

Anything the preloaded interpreter could not be — another interpreter, other `PYTHON*` settings —
starts a real one, and so does every call when GPUWARDEN_TESTS_PRELOAD=0 (to compare).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol

SERVER = Path(__file__).with_name("preload_server.py")
GPUWARDEN = [sys.executable, "-m", "gpuwarden"]
MAX_ENVIRONMENT = 100_000  # bytes of JSON; a socket message holds about 200 kB


class Process(Protocol):
    """What tests use of a started `gpuwarden` process, forked or real."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


class Captured(Process, Protocol):
    """A started process whose output the test reads at its end, as `Popen(stdout=PIPE,
    stderr=PIPE, text=True)`'s."""

    def communicate(self, input: str | None = None, timeout: float | None = None) -> tuple[str, str]: ...


class ForkedProcess:
    """A child of the preloaded interpreter; its exit status comes over its reply socket."""

    def __init__(self, args: list[str], reply: socket.socket) -> None:
        self.args = args
        self._reply = reply
        self._buffer = b""
        self._code: int | None = None
        self.pid = int(self._line(None))

    @property
    def returncode(self) -> int | None:
        return self._code

    def _line(self, timeout: float | None) -> str:
        self._reply.settimeout(timeout)
        while b"\n" not in self._buffer:
            chunk = self._reply.recv(64)
            if not chunk:
                raise RuntimeError("the preloaded interpreter closed the line to its child")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def wait(self, timeout: float | None = None) -> int:
        if self._code is None:
            try:
                self._code = int(self._line(timeout))
            except (TimeoutError, BlockingIOError):
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
            self._reply.close()
        return self._code

    def poll(self) -> int | None:
        if self._code is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.wait(0)
        return self._code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class PipedProcess(ForkedProcess):
    """A forked process whose stdout and stderr are pipes read by `communicate`."""

    def __init__(self, args: list[str], reply: socket.socket, pipes: tuple[int, int]) -> None:
        super().__init__(args, reply)
        self._read: list[bytes] = [b"", b""]
        self._readers = [
            threading.Thread(target=self._drain, args=(i, fd), daemon=True) for i, fd in enumerate(pipes)
        ]
        for reader in self._readers:
            reader.start()

    def _drain(self, index: int, fd: int) -> None:
        with open(fd, "rb") as stream:
            self._read[index] = stream.read()

    def communicate(self, input: str | None = None, timeout: float | None = None) -> tuple[str, str]:
        assert input is None, "the child's stdin is /dev/null"
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return _text(self._read[0]), _text(self._read[1])


class _Server:
    """One preloaded interpreter for one set of PYTHON* settings, for this test process's life."""

    def __init__(self, env: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._control = ours
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [sys.executable, str(SERVER), str(theirs.fileno())],
            env=dict(env),
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            cwd="/",
        )
        theirs.close()
        atexit.register(self.close)

    def start(
        self, args: list[str], env: Mapping[str, str], cwd: Path, stdio: Sequence[int]
    ) -> socket.socket:
        """Ask for a child; the socket its pid and then its exit status come over."""
        ours, theirs = socket.socketpair()
        doc = json.dumps({"argv": args[len(GPUWARDEN) :], "env": dict(env), "cwd": str(cwd)})
        with self._lock:
            socket.send_fds(self._control, [doc.encode()], [*stdio, theirs.fileno()])
        theirs.close()
        return ours

    def close(self) -> None:
        self._control.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)


_servers: dict[frozenset[tuple[str, str]], _Server] = {}
_servers_lock = threading.Lock()


def _server_for(args: Sequence[str], env: Mapping[str, str]) -> _Server | None:
    if os.environ.get("GPUWARDEN_TESTS_PRELOAD") == "0" or list(args[: len(GPUWARDEN)]) != GPUWARDEN:
        return None
    if len(json.dumps(dict(env))) > MAX_ENVIRONMENT:
        return None  # one request is one socket message: a test of huge environments starts a real one
    # What the interpreter reads as it starts must be what the preloaded one read.
    settings = frozenset((k, v) for k, v in env.items() if k.startswith("PYTHON"))
    with _servers_lock:
        if settings not in _servers:
            ours = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
            _servers[settings] = _Server({**ours, **dict(settings)})
        return _servers[settings]


def popen(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    stdout: IO[bytes] | int,
    stderr: IO[bytes] | int,
) -> Process:
    """`subprocess.Popen(args, env=, cwd=, stdout=, stderr=)` (streams: open files or descriptors),
    stdin /dev/null."""
    server = _server_for(args, env)
    if server is None:
        return subprocess.Popen(
            list(args),
            env=dict(env),
            cwd=cwd,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
        )
    with open(os.devnull, "rb") as null:
        fds = [null.fileno(), _fd(stdout), _fd(stderr)]
        return ForkedProcess(list(args), server.start(list(args), env, cwd, fds))


def popen_captured(args: Sequence[str], *, env: Mapping[str, str], cwd: Path) -> Captured:
    """`subprocess.Popen(args, env=, cwd=, stdout=PIPE, stderr=PIPE, text=True)`."""
    server = _server_for(args, env)
    if server is None:
        return subprocess.Popen(
            list(args),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    try:
        with open(os.devnull, "rb") as null:
            reply = server.start(list(args), env, cwd, [null.fileno(), out_w, err_w])
    finally:
        os.close(out_w)
        os.close(err_w)
    return PipedProcess(list(args), reply, (out_r, err_r))


def _fd(stream: IO[bytes] | int) -> int:
    return stream if isinstance(stream, int) else stream.fileno()


def run(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(args, env=, cwd=, timeout=, capture_output=True, text=True)`."""
    env = os.environ if env is None else env
    cwd = Path.cwd() if cwd is None else cwd
    if _server_for(args, env) is None:
        return subprocess.run(
            list(args), env=dict(env), cwd=cwd, timeout=timeout, capture_output=True, text=True
        )
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = popen(args, env=env, cwd=cwd, stdout=out, stderr=err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(list(args), code, _text(out.read()), _text(err.read()))


def _text(data: bytes) -> str:
    """As `text=True` reads a pipe: universal newlines."""
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")
