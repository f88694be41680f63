"""A retune's probes as the run's events while they run (`probe` in docs/events.md): one when a
probe starts, one every few seconds while it runs, one when it ends with what it measured; and
the retune's waits (`waiting`), every few seconds while it waits.

A retune probes for half a minute or more; without these a run says nothing between `retuning`
and `retuned`, and its follower cannot tell a slow probe from a stuck daemon.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gpuwarden.core.oom.recovery import Probe, ProbeTurn
from gpuwarden.core.units import size
from gpuwarden.daemon.supervise.hooks import RetuneGiveUp, RetuneNotes

log = logging.getLogger("gpuwarden.daemon.oom_retune")

# Under the few seconds of silence a follower reads as "stuck", with room for a slow writer.
HEARTBEAT_S = 2.5


class WatchedProbes:
    """Wraps a retune's probe: each call is told through `notes` as it starts, runs and ends.
    Once the run was stopped none starts and none is told (its stop killed the one running)."""

    def __init__(
        self,
        notes: RetuneNotes,
        *,
        stopped: Callable[[], bool] = lambda: False,
        heartbeat_s: float = HEARTBEAT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._notes = notes
        self._stopped = stopped
        self._heartbeat_s = heartbeat_s
        self._clock = clock
        self._turn: ProbeTurn | None = None
        self._count = 0

    def turn(self, turn: ProbeTurn) -> None:
        """The recovery plan's word on the probe about to run (its number, how many are planned)."""
        self._turn = turn

    def watch(self, probe: Probe) -> Probe:
        def watched(batch: int) -> tuple[int | None, bool]:
            if self._stopped():
                raise RetuneGiveUp("stopped while probing")
            turn = self._current(batch)
            self._notes("probe", **started(turn))
            begun = self._clock()
            with self._heartbeat(turn, begun):
                peak, oom = probe(batch)
            if self._stopped():
                raise RetuneGiveUp("stopped while probing")
            self._notes("probe", **ended(turn, peak, oom, self._clock() - begun))
            return peak, oom

        return watched

    def _current(self, batch: int) -> ProbeTurn:
        """The turn the plan announced for this batch; counted here when it announced none."""
        self._count += 1
        turn = self._turn
        self._turn = None
        if turn is not None and turn.batch_size == batch:
            return turn
        return ProbeTurn(self._count, self._count, batch, None)

    @contextmanager
    def _heartbeat(self, turn: ProbeTurn, begun: float) -> Iterator[None]:
        """A `running` note every `heartbeat_s` until the probe returns."""
        done = threading.Event()

        def beat() -> None:
            while not done.wait(self._heartbeat_s):
                try:
                    self._notes("probe", **running(turn, self._clock() - begun))
                except Exception:
                    log.exception("probe %d: its progress could not be recorded", turn.number)
                    return

        thread = threading.Thread(target=beat, name=f"probe-{turn.number}-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()


def _head(turn: ProbeTurn) -> str:
    return f"probe {turn.number} of {turn.planned}: micro-batch {turn.batch_size}"


def _fields(turn: ProbeTurn, phase: str) -> dict[str, Any]:
    return {"phase": phase, "number": turn.number, "planned": turn.planned, "batch_size": turn.batch_size}


def started(turn: ProbeTurn) -> dict[str, Any]:
    """`probe 2 of 2: micro-batch 8 × 4 starting` (× the accumulation it holds, where there is one)."""
    accum = f" × {turn.grad_accum_steps}" if turn.grad_accum_steps is not None else ""
    return {
        **_fields(turn, "started"),
        "grad_accum_steps": turn.grad_accum_steps,
        "message": f"{_head(turn)}{accum} starting",
    }


def running(turn: ProbeTurn, seconds: float) -> dict[str, Any]:
    """`probe 2 of 2: micro-batch 8 running, 5 s`."""
    return {
        **_fields(turn, "running"),
        "seconds": round(seconds, 1),
        "message": f"{_head(turn)} running, {seconds:.0f} s",
    }


def ended(turn: ProbeTurn, peak: int | None, oom: bool, seconds: float) -> dict[str, Any]:
    """`probe 2 of 2: micro-batch 8 → peak 1.1 GiB, fits (9.8 s)`; out of memory, or no
    measurement when it failed otherwise."""
    fits = not oom and peak is not None
    verdict = "out of memory" if oom else "fits" if fits else "no measurement"
    measured = f"peak {size(peak)}, " if peak is not None else ""
    return {
        **_fields(turn, "ended"),
        "mem_peak": peak,
        "fits": fits,
        "oom": oom,
        "seconds": round(seconds, 1),
        "message": f"{_head(turn)} → {measured}{verdict} ({seconds:.1f} s)",
    }


def waiting(why: str, seconds: float, bound: float) -> dict[str, Any]:
    """`waiting for other processes to free GPU memory: 5 of 60 s`."""
    return {
        "seconds": round(seconds, 1),
        "of": bound,
        "message": f"waiting for {why}: {seconds:.0f} of {bound:.0f} s",
    }
