"""Every machine but the first of a run over several: it starts its part of each attempt.

The first machine's `gpuwarden exec` (the leader) supervises the run and decides every retune;
this one waits for the leader to say it is alive, then starts its torchrun from each attempt's
plan (this machine's ranks, the same program and rendezvous), passes on the signals the leader
writes for the attempt, records how its torchrun ended, and ends with the run's own exit code
when the leader says the run is over. A leader silent for `LEADER_SILENCE_S` is gone (killed, or
its machine lost): this part is stopped and the exec ends with "start me again".
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpuwarden.core.errors import UserError
from gpuwarden.core.exit_record import read_status, write_status
from gpuwarden.core.gang.nodes import (
    LEADER_FILE,
    Forwarded,
    NodePlan,
    node_command,
    node_exit_path,
    node_output,
    read_beat,
    read_plan,
    read_signal,
)
from gpuwarden.daemon import run_environment
from gpuwarden.daemon.process import RUN_TAG, ExitStatus, run_tag
from gpuwarden.daemon.supervise.backends import ChildProcess, ProcessLayer
from gpuwarden.job import exit_codes

POLL_S = 0.1
# How long a follower waits for a leader to start (the first machine's job step may start later).
LEADER_WAIT_S = 600.0
# A leader that has not raised its heartbeat (every second) for this long is gone.
LEADER_SILENCE_S = 30.0
STOP_GRACE_S = 10.0


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class NodeFollower:
    """Machine `node_rank` of a run in `run_dir`; `say` prints one line for the job's log."""

    def __init__(
        self,
        run_dir: Path,
        node_rank: int,
        processes: ProcessLayer,
        say: Callable[[str], None],
        *,
        environ: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_dir = run_dir
        self.node_rank = node_rank
        self.processes = processes
        self.say = say
        self.environ = dict(os.environ if environ is None else environ)
        self.clock = clock
        self.token = ""
        self._beat = -1
        self._heard = 0.0
        self._started = 0  # the newest attempt this machine started
        self._child: ChildProcess | None = None
        self._attempt_dir: Path | None = None
        self._forwarded: Forwarded | None = None
        self._candidate: tuple[str, int] | None = None  # another leader's token and first beat

    def run(self) -> int:
        """Follow the leader until the run is over; the exit code this exec ends with."""
        self._await_leader()
        while True:
            code = self._pass()
            if code is not None:
                return code
            time.sleep(POLL_S)

    def _await_leader(self) -> None:
        """A leader that is alive now: a heartbeat that rises (a file left by an earlier job's
        leader does not)."""
        first = read_beat(self.run_dir)
        deadline = self.clock() + LEADER_WAIT_S
        self.say(f"node {self.node_rank}: waiting for node 0's gpuwarden exec in {self.run_dir}")
        while self.clock() < deadline:
            beat = read_beat(self.run_dir)
            if beat is None or beat.exit_code is not None:
                time.sleep(POLL_S)
                continue
            if first is None or (beat.token, beat.beat) != (first.token, first.beat):
                self.token, self._beat, self._heard = beat.token, beat.beat, self.clock()
                self.say(f"node {self.node_rank}: following run {beat.run_id or '(new)'}")
                return
            time.sleep(POLL_S)
        raise UserError(
            f"node {self.node_rank}: no gpuwarden exec of node 0 said it was alive in "
            f"{self.run_dir / LEADER_FILE} for {LEADER_WAIT_S:.0f} s — start it (--node-rank 0) on the first "
            "machine with the same --run folder, on a file system both machines share"
        )

    def _pass(self) -> int | None:
        """One look at the leader, the plans and this machine's torchrun."""
        beat = read_beat(self.run_dir)
        now = self.clock()
        if beat is not None and beat.token != self.token and beat.exit_code is None:
            self._new_leader(beat.token, beat.beat, now)
        if beat is not None and beat.token == self.token and beat.beat != self._beat:
            self._beat, self._heard = beat.beat, now
        if beat is not None and beat.token == self.token and beat.exit_code is not None:
            self._end_part("the run is over")
            return beat.exit_code
        if now - self._heard > LEADER_SILENCE_S:
            self._end_part(f"node 0's gpuwarden exec has been silent for {LEADER_SILENCE_S:.0f} s")
            self.say(f"node {self.node_rank}: exit {exit_codes.RESTART} — start the job again to go on")
            return exit_codes.RESTART
        if self._child is not None:
            self._watch_part()
        if self._child is None:
            self._start_newest()
        return None

    def _new_leader(self, token: str, beat: int, now: float) -> None:
        """Node 0's exec started again (the one before was killed): once its heartbeat rises, it
        is the leader; this machine's part of the attempt it took over runs on."""
        if self._candidate is None or self._candidate[0] != token:
            self._candidate = (token, beat)
            return
        if self._candidate[1] == beat:
            return
        self.token, self._beat, self._heard, self._candidate = token, beat, now, None
        self.say(f"node {self.node_rank}: node 0's gpuwarden exec started again: following it")

    def _start_newest(self) -> None:
        attempts = sorted(
            (int(folder.name), folder)
            for folder in (self.run_dir / "attempts").glob("*")
            if folder.name.isdigit() and int(folder.name) > self._started
        )
        for number, folder in reversed(attempts):
            plan = read_plan(folder)
            if plan is not None and plan.leader == self.token:
                self._started = number
                self._start(plan, folder)
                return

    def _start(self, plan: NodePlan, attempt_dir: Path) -> None:
        argv, added = node_command(plan, self.node_rank, attempt_dir, sys.executable, _cpus())
        env = run_environment.submitted(self.environ) or {}
        env.update(added)
        env[RUN_TAG] = run_tag(plan.run_id, plan.attempt)
        stdout, stderr = node_output(attempt_dir, self.node_rank)
        exit_file = node_exit_path(attempt_dir, self.node_rank)
        try:
            self._child = self.processes.spawn(
                argv, env, Path(plan.cwd), stdout, stderr, plan.memory_limit, exit_file=exit_file
            )
        except (OSError, UserError) as exc:
            # Said where the leader looks: the attempt fails for every machine at once.
            self.say(f"node {self.node_rank}: cannot start attempt {plan.attempt}: {exc}")
            exit_file.write_text('{"code": 127}\n')  # the exit recorder's format
            return
        self._attempt_dir, self._forwarded = attempt_dir, None
        first = self.node_rank * plan.ranks_per_node
        last = first + plan.ranks_per_node - 1
        ranks = f"rank {first}" if first == last else f"ranks {first}–{last}"
        self.say(f"node {self.node_rank}: attempt {plan.attempt} started ({ranks}, pid {self._child.pid})")

    def _watch_part(self) -> None:
        child, attempt_dir = self._child, self._attempt_dir
        assert child is not None and attempt_dir is not None
        asked = read_signal(attempt_dir)
        if asked is not None and asked != self._forwarded and self._forwarded != "SIGKILL":
            self._forwarded = asked
            if asked == "SIGKILL":
                child.signal_tree(signal.SIGKILL)
            else:
                child.signal_group(signal.SIGTERM)
        status = child.poll()
        if status is not None:
            self.say(f"node {self.node_rank}: attempt {self._started} ended ({status.describe()})")
            self._record(attempt_dir, status)
            self._child = None

    def _record(self, attempt_dir: Path, status: ExitStatus) -> None:
        """Make sure the leader learns how this part ended: a SIGKILL to the part's tree (the
        leader's, after its grace) kills the exit recorder too, before it writes; this exec is the
        recorder's parent and knows how it ended."""
        path = str(node_exit_path(attempt_dir, self.node_rank))
        if read_status(path) is not None or not status.known:
            return
        ended = {"signal": status.signal} if status.signal is not None else {"code": status.code or 0}
        try:
            write_status(path, ended)
        except OSError as exc:  # the leader gives up waiting on this machine after its bound
            self.say(f"node {self.node_rank}: cannot write {path}: {exc}")

    def _end_part(self, why: str) -> None:
        """Stop this machine's torchrun, if it still runs: SIGTERM, then SIGKILL after a grace."""
        child = self._child
        if child is None:
            return
        self.say(f"node {self.node_rank}: stopping attempt {self._started}: {why}")
        child.signal_group(signal.SIGTERM)
        deadline = self.clock() + STOP_GRACE_S
        while child.poll() is None and self.clock() < deadline:
            time.sleep(POLL_S)
        if child.poll() is None:
            child.signal_tree(signal.SIGKILL)
        status = child.poll()
        if status is not None and self._attempt_dir is not None:
            self._record(self._attempt_dir, status)
        self._child = None
