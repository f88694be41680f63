"""The asking side of a probe session (`python -m gpuwarden.runners.probe_session`): one process
that loads the model once and measures the sizes it is sent, one at a time, each in a fork of
itself (so each size's peaks are its own, in any order).

A new process is started only when there is none or the last one ended (it ends when building
the model itself failed, or when it was stopped).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gpuwarden.core.rlimit import limited_argv

SESSION_MODULE = "gpuwarden.runners.probe_session"
CLOSE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SizeRequest:
    """One size to measure: its spec, its own run folder and events file."""

    spec: Path
    run_dir: Path
    events: Path

    def line(self) -> str:
        doc = {"spec": str(self.spec), "run_dir": str(self.run_dir), "events": str(self.events)}
        return json.dumps(doc) + "\n"


class ProbeProcesses:
    """Sizes measured in as few processes as the peaks allow; `started` counts the processes."""

    def __init__(self, env: dict[str, str], limit: int | None, stderr: Path) -> None:
        self._env = env
        self._limit = limit
        self._stderr = stderr
        self._proc: subprocess.Popen[str] | None = None
        self.started = 0

    def measure(self, request: SizeRequest, timeout_s: float) -> int | None:
        """The size's exit status as the runner's would be (None: it ran past `timeout_s` and its
        process was killed)."""
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._start()
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(request.line())
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return self._ended()
        reply = _read_line(proc.stdout, timeout_s)
        if reply is None:
            self.kill()
            return None
        try:
            return int(json.loads(reply)["status"])
        except (ValueError, KeyError, TypeError):
            return self._ended()  # no answer: the process ended (EOF) or said something else

    def _start(self) -> None:
        argv = limited_argv([sys.executable, "-m", SESSION_MODULE], self._limit)
        self._stderr.parent.mkdir(parents=True, exist_ok=True)
        with open(self._stderr, "ab") as err:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=self._env,
                text=True,
                start_new_session=True,
            )
        self.started += 1

    def _ended(self) -> int | None:
        """The exit status of a process that stopped answering (killed when it has not ended)."""
        proc = self._proc
        assert proc is not None
        try:
            code = proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        self._proc = None
        return code

    def close(self) -> None:
        """End the live process: its stdin closed, it finishes (killed if it does not in time)."""
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
        self._close_pipes(proc)
        self._proc = None

    def kill(self) -> None:
        """SIGKILL to the live process's group (it leads its own session)."""
        proc = self._proc
        if proc is None:
            return
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self._close_pipes(proc)
        self._proc = None

    @staticmethod
    def _close_pipes(proc: subprocess.Popen[str]) -> None:
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _read_line(stream: IO[str], timeout_s: float) -> str | None:
    """One line from `stream` ("" at its end), or None when none came within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([stream], [], [], min(left, 1.0))
        if ready:
            return stream.readline()
