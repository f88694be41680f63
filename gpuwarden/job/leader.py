"""The first machine of a run over several: how its supervisor reaches the others.

It publishes each attempt for them (`core/gang/nodes.py`), says every second that it is alive,
and watches the attempt as one process: its own torchrun and the other machines' (each records
how its torchrun ended). A signal to the attempt reaches every machine: the leader writes it for
the attempt, each follower passes it on within a tenth of a second.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpuwarden.core.gang.launch import NodeRole
from gpuwarden.core.gang.nodes import (
    LEADER_FILE,
    Forwarded,
    LeaderBeat,
    NodePlan,
    node_exit_path,
    plan_path,
    signal_path,
    write_whole,
)
from gpuwarden.daemon.process import ExitStatus
from gpuwarden.daemon.supervise.backends import ChildProcess

log = logging.getLogger("gpuwarden.job")

BEAT_S = 1.0
# After this machine's torchrun ended, how long the others get to end by themselves (they end
# together: a finished gang's agents wait for each other), then after a SIGTERM, after a SIGKILL.
OTHERS_END_S = 5.0
OTHERS_TERM_S = 5.0
OTHERS_KILL_S = 10.0


def free_port() -> int:
    """A TCP port free on this machine now, for the attempt's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class LeaderMachines:
    """`OtherMachines` for the first node's `gpuwarden exec`: `nodes` machines in all, reached
    through the run folder `run_dir`; the ranks meet at `host` (this machine's address)."""

    def __init__(
        self, run_dir: Path, nodes: int, host: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.run_dir = run_dir
        self.nodes = nodes
        self.host = host
        self.clock = clock
        self.token = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"
        self._beat = 0
        self._run_id = ""
        self._ended = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def count(self) -> int:
        return self.nodes

    def start(self) -> None:
        """Say this leader is alive (before any plan), then every second."""
        self._write_beat(None)
        self._thread = threading.Thread(target=self._beating, name="leader-beat", daemon=True)
        self._thread.start()

    def end(self, exit_code: int) -> None:
        """The run is over here: the other machines end with `exit_code` (the run's own)."""
        self._ended.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._write_beat(exit_code)

    def _beating(self) -> None:
        while not self._ended.wait(BEAT_S):
            try:
                self._write_beat(None)
            except OSError as exc:  # a full or gone file system: the followers will say so
                log.warning("cannot write %s: %s", self.run_dir / LEADER_FILE, exc)

    def _write_beat(self, exit_code: int | None) -> None:
        self._beat += 1
        beat = LeaderBeat(token=self.token, beat=self._beat, run_id=self._run_id, exit_code=exit_code)
        write_whole(self.run_dir / LEADER_FILE, beat.model_dump_json())

    def rendezvous(self, run_id: str, attempt: int) -> NodeRole:
        self._run_id = run_id
        return NodeRole(self.nodes, 0, f"{self.host}:{free_port()}", f"{run_id}-{attempt}")

    def publish(self, plan: NodePlan, attempt_dir: Path) -> None:
        signal_path(attempt_dir).unlink(missing_ok=True)
        for node in range(1, self.nodes):
            node_exit_path(attempt_dir, node).unlink(missing_ok=True)
        write_whole(plan_path(attempt_dir), plan.model_copy(update={"leader": self.token}).model_dump_json())

    def watch(self, child: ChildProcess, attempt_dir: Path) -> ChildProcess:
        return NodesChild(child, attempt_dir, self.nodes, self.clock)


class NodesChild:
    """An attempt over several machines as the supervisor's one process (`ChildProcess`)."""

    def __init__(
        self, local: ChildProcess, attempt_dir: Path, nodes: int, clock: Callable[[], float]
    ) -> None:
        self.local = local
        self.attempt_dir = attempt_dir
        self.others = list(range(1, nodes))
        self.clock = clock
        self._local_end: tuple[ExitStatus, float] | None = None
        self._sent: Forwarded | None = None

    @property
    def pid(self) -> int:
        return self.local.pid

    @property
    def create_time(self) -> float:
        return self.local.create_time

    @property
    def adopted(self) -> bool:
        return self.local.adopted

    def _others_running(self) -> list[int]:
        return [node for node in self.others if not node_exit_path(self.attempt_dir, node).exists()]

    def poll(self) -> ExitStatus | None:
        """This machine's torchrun's status once every machine's has ended; the others are asked
        to stop (then killed) when they outlast it, and one that never says is given up on."""
        if self._local_end is None:
            status = self.local.poll()
            if status is None:
                return None
            self._local_end = (status, self.clock())
        status, ended_at = self._local_end
        running = self._others_running()
        if not running:
            return status
        waited = self.clock() - ended_at
        if waited >= OTHERS_END_S + OTHERS_TERM_S + OTHERS_KILL_S:
            log.warning("machines %s never said how their part of %s ended", running, self.attempt_dir)
            return status
        if waited >= OTHERS_END_S + OTHERS_TERM_S:
            self._tell("SIGKILL")
        elif waited >= OTHERS_END_S:
            self._tell("SIGTERM")
        return None

    def _tell(self, sig: Forwarded) -> None:
        if self._sent == "SIGKILL" or self._sent == sig:
            return
        self._sent = sig
        try:
            write_whole(signal_path(self.attempt_dir), sig)
        except OSError as exc:  # the run folder is gone or full: the others stop with the leader
            log.warning("cannot tell the other machines %s: %s", sig, exc)

    def group_alive(self) -> bool:
        return self.local.group_alive() or bool(self._others_running())

    def signal_group(self, sig: int) -> bool:
        self._forward(sig)
        return self.local.signal_group(sig) or bool(self._others_running())

    def signal_tree(self, sig: int) -> bool:
        self._forward(sig)
        return self.local.signal_tree(sig) or bool(self._others_running())

    def _forward(self, sig: int) -> None:
        if sig == signal.SIGKILL:
            self._tell("SIGKILL")
        elif sig in (signal.SIGTERM, signal.SIGINT):
            self._tell("SIGTERM")
