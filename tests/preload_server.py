"""A Python that has imported gpuwarden's CLI and daemon once, and forks a `gpuwarden ARGS…` per
request: what `python -m gpuwarden ARGS…` does, without paying the imports again.

The suite starts hundreds of daemons and CLI calls; each fresh interpreter spends a second of CPU
importing FastAPI, pydantic's models and httpx before the first line of the command runs, and the
2-core test machine is bound by CPU. A forked child is still its own process with its own argv,
environment, folder, standard streams, exit status and signals; only the imports are shared.
`tests/preloaded.py` is the other end; tests that measure the start itself (what a command
imports, how long it takes) start a real interpreter instead.

Protocol, over a SOCK_SEQPACKET socket passed as argv[1] (one message per request, so threads of
the test process may ask at once): a JSON document {"argv", "env", "cwd"} with four descriptors —
stdin, stdout, stderr and the request's own reply socket. The reply socket gets the child's pid,
then its exit status as `subprocess` writes it (negative: killed by that signal), a line each. The
server exits when the test process closes its end.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import selectors
import socket
import sys
from dataclasses import dataclass

# What a daemon and the commands import at their start; anything else is imported by the child.
import gpuwarden.cli.main
import gpuwarden.client
import gpuwarden.daemon.daemon
import gpuwarden.daemon.http
import gpuwarden.daemon.server  # noqa: F401

MAX_REQUEST = 1 << 20


@dataclass
class Request:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    stdio: list[int]


def serve(control: socket.socket) -> Request:
    """Fork a child per request; return (in the child only) the request it is to run."""
    waiting: dict[int, tuple[int, socket.socket]] = {}  # pidfd → (pid, reply socket)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is control:
                payload, fds, _, _ = socket.recv_fds(control, MAX_REQUEST, 4)
                if not payload:
                    sys.exit(0)  # the test process is gone
                request = _fork(payload, fds, control, selector, waiting)
                if request is not None:
                    return request
            else:
                _reap(key.fd, selector, waiting)


def _fork(
    payload: bytes,
    fds: list[int],
    control: socket.socket,
    selector: selectors.BaseSelector,
    waiting: dict[int, tuple[int, socket.socket]],
) -> Request | None:
    doc = json.loads(payload)
    reply = socket.socket(fileno=fds[3])
    pid = os.fork()
    if pid == 0:
        selector.close()
        control.close()
        for pidfd, (_, other) in waiting.items():
            os.close(pidfd)
            other.close()
        reply.close()
        return Request(doc["argv"], doc["env"], doc["cwd"], fds[:3])
    for fd in fds[:3]:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    waiting[pidfd] = (pid, reply)
    selector.register(pidfd, selectors.EVENT_READ)
    _send(reply, pid)
    return None


def _reap(
    pidfd: int, selector: selectors.BaseSelector, waiting: dict[int, tuple[int, socket.socket]]
) -> None:
    pid, reply = waiting.pop(pidfd)
    selector.unregister(pidfd)
    os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    _send(reply, os.waitstatus_to_exitcode(status))
    reply.close()


def _send(reply: socket.socket, value: int) -> None:
    # An OSError: the test gave up on this process (a timeout); there is no one to tell.
    with contextlib.suppress(OSError):
        reply.sendall(f"{value}\n".encode())


def run(request: Request) -> None:
    """Become `python -m gpuwarden ARGV…` started in `cwd` with `env` and these streams."""
    for target, fd in enumerate(request.stdio):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    sys.path[0] = os.getcwd()  # `python -m` puts the folder it starts in first
    sys.argv = ["-m", *request.argv]
    runpy.run_module("gpuwarden", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    run(serve(socket.socket(fileno=int(sys.argv[1]))))
