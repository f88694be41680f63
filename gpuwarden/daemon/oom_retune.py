"""The daemon's retune hook: what the next attempt of a run that ran out of memory looks like.

Runs on the `retune-<run>` thread the supervisor starts while the run is `retuning`, so probes
and waits never hold up other runs. It waits until the failed attempt's GPU memory is released,
plans the restart with `core.oom.recovery` (probing in one short runner process where a built-in
run has no memory figures of its own), applies waits and GPU moves, and returns the next attempt's
spec and the record to store — or raises `RetuneGiveUp` with the reason the run must fail.

A user's own program is never probed on a restart: a probe of it is a start of the same program
(its imports, its model load, its resume), as costly as the restart, so the restart itself is the
measurement — when the size fits, the run goes on with nothing spent; when it does not, its
failure is the next retune's evidence, as a probe's would have been.

A gang is retuned from the evidence of the rank that ran out of memory (its `oom` event, its
progress, its stderr); the one decision applies to every rank, since they all run one spec. Its
probes are one process at a micro-batch on that rank's GPU.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuwarden.core.checkpoints import find_latest_checkpoint
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.oom.recovery import AttemptFacts, RecoveryPlan, plan_recovery
from gpuwarden.core.telemetry.types import GpuProcess
from gpuwarden.core.tune.memory_points import MemoryPoints, memory_key
from gpuwarden.core.tune.probe import SubprocessProber
from gpuwarden.core.tune.search import Candidate
from gpuwarden.daemon import run_environment
from gpuwarden.daemon.placement import GpuState
from gpuwarden.daemon.process import RUN_TAG, run_tag
from gpuwarden.daemon.retune_probes import HEARTBEAT_S, WatchedProbes, waiting
from gpuwarden.daemon.supervise.hooks import AttemptEnd, NextAttempt, RetuneGiveUp, RetuneNotes, unheard

# A measurement at a micro-batch: (peak memory or None, ran out of memory).
Probe = Callable[[int], tuple[int | None, bool]]
log = logging.getLogger("gpuwarden.daemon.oom_retune")

RELEASE_TIMEOUT_S = 30.0


class OomRetune:
    """Callable as the supervisor's RetuneHook."""

    def __init__(
        self,
        *,
        gpu_states: Callable[[], list[GpuState]],
        gpu_processes: Callable[[], list[GpuProcess]],
        retunes_of: Callable[[str], list[dict[str, Any]]],
        environment_of: Callable[[str], Mapping[str, str] | None] = lambda run_id: None,
        stopped: Callable[[str], bool] = lambda run_id: False,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        release_timeout: float = RELEASE_TIMEOUT_S,
        heartbeat_s: float = HEARTBEAT_S,
        memory_points: MemoryPoints | None = None,
    ) -> None:
        self._gpu_states = gpu_states
        self._gpu_processes = gpu_processes
        self._retunes_of = retunes_of
        self._environment_of = environment_of
        self._stopped = stopped
        self._sleep = sleep
        self._clock = clock
        self._release_timeout = release_timeout
        self._heartbeat_s = heartbeat_s
        self._memory_points = memory_points

    def __call__(
        self,
        run: Mapping[str, Any],
        end: AttemptEnd,
        events: Sequence[Mapping[str, Any]],
        notes: RetuneNotes = unheard,
    ) -> NextAttempt | None:
        spec = spec_from_mapping(dict(run["spec"]))
        run_id = str(run["id"])
        events = rank_events(events, end)
        self._wait_released(end, notes)
        retunes = self._retunes_of(run_id)
        first_oom = min((float(r["ts"]) for r in retunes), default=self._clock())
        run_dir = Path(str(run["run_dir"]))
        probe_dir = run_dir / "probes" / f"after-{end.number}"
        # Each probe is told as the run's event as it runs; none starts once the run was stopped
        # (its stop ends the probe running: the probes carry the run's tag).
        probes = WatchedProbes(notes, stopped=lambda: self._stopped(run_id), heartbeat_s=self._heartbeat_s)
        probe, processes = self._probe(spec, run, end, probe_dir)
        key = memory_key(spec, bool(end.gpus), end.gpu_capacity if end.gpus else end.host_capacity)
        try:
            plan = plan_recovery(
                spec,
                _facts(end, events),
                history=_decisions(retunes),
                retunes_so_far=len(retunes),
                elapsed_s=self._clock() - first_oom,
                probe=probes.watch(probe) if probe is not None else None,
                hints=self._gpu_hints(end, events),
                on_turn=probes.turn,
                remembered=self._remembered(key),
                probe_processes=processes.count if processes is not None else None,
                restart_measures=spec.command is not None,
            )
        finally:
            if processes is not None:
                processes.close()  # the probe session waiting for its next size
            shutil.rmtree(probe_dir, ignore_errors=True)
        self._remember(key, plan)
        if plan.give_up is not None:
            raise RetuneGiveUp(plan.give_up)
        assert plan.spec is not None
        decision = plan.decision
        if decision.wait_s:
            log.info("run %s: waiting %.0f s for other processes to free GPU memory", run_id, decision.wait_s)
            self._sleep_told(notes, decision.wait_s, "other processes to free GPU memory")
        if decision.action == "move_gpu":
            self._move(plan, end)
        return NextAttempt(
            spec=plan.spec,
            from_=plan.from_,
            to=plan.to,
            verdict=plan.classification.verdict,
            evidence=plan.evidence(),
            prediction=decision.prediction,
        )

    def _remembered(self, key: str | None) -> list[tuple[int, int]]:
        """What earlier runs of the same shape measured under the same memory."""
        if self._memory_points is None or key is None:
            return []
        return self._memory_points.get(key)

    def _remember(self, key: str | None, plan: RecoveryPlan) -> None:
        """The probes' points, for the next run of this shape; a disk that refuses costs only that."""
        if self._memory_points is None or key is None:
            return
        measured = [(int(p["batch_size"]), int(p["peak"])) for p in plan.probes if not p["oom"] and p["peak"]]
        try:
            self._memory_points.add(key, measured)
        except OSError as exc:
            log.warning("could not remember the probes' memory points: %s", exc)

    def _probe(
        self, spec: RunSpec, run: Mapping[str, Any], end: AttemptEnd, probe_dir: Path
    ) -> tuple[Probe | None, ProbeProcessCount | None]:
        """Short processes that measure a built-in run's restart memory, and how many of them ran
        where that is not one per size (None: the evidence and the ladder decide, and a command
        run's restart measures its own size)."""
        if spec.kind in ("train", "infer"):
            prober = self._prober(str(run["id"]), spec, end, Path(str(run["run_dir"])), probe_dir)
            return _probe_of(prober, spec), ProbeProcessCount(prober)
        return None, None

    def _wait_released(self, end: AttemptEnd, notes: RetuneNotes) -> None:
        """Until no process of the attempt's groups (a gang's ranks lead their own) holds GPU
        memory (bounded), said every heartbeat meanwhile: a restart that starts while the old
        CUDA context is still being torn down runs out of memory again."""
        if not end.gpus or end.pid is None:
            return
        groups = {end.pid, *end.rank_pids}
        begun = self._clock()
        told = begun - self._heartbeat_s  # the first time it is held, say so at once
        while self._clock() < begun + self._release_timeout:
            holders = [p for p in self._gpu_processes() if p.uuid in end.gpus and _in_groups(p.pid, groups)]
            if not holders:
                return
            if self._clock() - told >= self._heartbeat_s:
                told = self._clock()
                why = f"attempt {end.number}'s GPU memory to be released"
                notes("waiting", **waiting(why, told - begun, self._release_timeout))
            self._sleep(0.5)
        log.warning(
            "GPU memory of attempt %d still held after %.0f s; restarting anyway",
            end.number,
            self._release_timeout,
        )

    def _sleep_told(self, notes: RetuneNotes, seconds: float, why: str) -> None:
        """Sleep `seconds`, saying so every heartbeat: a run that waits is not a stuck one."""
        waited = 0.0
        while waited < seconds:
            notes("waiting", **waiting(why, waited, seconds))
            step = min(self._heartbeat_s, seconds - waited)
            self._sleep(step)
            waited += step

    def _prober(
        self, run_id: str, spec: RunSpec, end: AttemptEnd, run_dir: Path, work_dir: Path
    ) -> SubprocessProber:
        env = run_environment.base(self._environment_of(run_id))  # as the run's attempts start
        env.update(spec.env)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(_rank_gpus(end))
        env[RUN_TAG] = run_tag(run_id, None)  # a restarted daemon finds leftover probes by it
        # What the restarted attempt will do: resume from the run's checkpoint, hold its
        # accumulation's micro-batches, save checkpoints where that allocates (the host). A
        # run's sizes share one process (a training run's loads the model once).
        return SubprocessProber(
            spec,
            work_dir,
            env=env,
            warmup_steps=1,
            measure_steps=1,
            timeout_s=600,
            resume_from=find_latest_checkpoint(run_dir / "checkpoints"),
            include_saves=spec.resources.memory_limit is not None,
            session=True,
        )

    def _move(self, plan: RecoveryPlan, end: AttemptEnd) -> None:
        """Point the next attempt at the GPU with the most free memory that it did not use (a
        gang: that GPU instead of the failed rank's, the others kept)."""
        others = [g for g in self._gpu_states() if g.uuid not in end.gpus and not g.lost]
        if not others or plan.spec is None:
            raise RetuneGiveUp("other processes hold the GPU's memory and there is no other GPU to move to")
        best = max(others, key=lambda g: (g.memory_total or 0) - (g.memory_used or 0))
        resources = plan.spec.setdefault("resources", {})
        plan.from_["resources.gpus"] = resources.get("gpus", 1)
        moved = [best.uuid]
        if end.world_size > 1 and len(end.gpus) == end.world_size:
            failed = _rank_gpus(end)[0]
            moved = [best.uuid if uuid == failed else uuid for uuid in end.gpus]
        resources["gpus"] = moved
        plan.to["resources.gpus"] = moved

    def _gpu_hints(self, end: AttemptEnd, events: Sequence[Mapping[str, Any]]) -> dict[str, int]:
        """How many other GPUs a move could go to, and how many a gang could run on now (not
        lost, not the one that ran out, with free memory for what a rank used)."""
        states = [g for g in self._gpu_states() if not g.lost]
        if not states:
            return {}
        need = _rank_need(events, end.number)
        failed = set(_rank_gpus(end)) if end.world_size > 1 else set()
        usable = [
            g for g in states if g.uuid not in failed and (need is None or g.free is None or g.free >= need)
        ]
        return {"other_gpus": sum(1 for g in states if g.uuid not in end.gpus), "usable_gpus": len(usable)}


class ProbeProcessCount:
    """How many processes a prober started, and the end of the one still alive."""

    def __init__(self, prober: SubprocessProber) -> None:
        self._prober = prober

    def count(self) -> int:
        return self._prober.processes

    def close(self) -> None:
        self._prober.close()


def _probe_of(prober: SubprocessProber, spec: RunSpec) -> Probe:
    """The prober as a retune's probe: a micro-batch with the accumulation that keeps the run's
    effective batch."""
    t = spec.train
    i = spec.infer

    def probe(batch: int) -> tuple[int | None, bool]:
        if t is not None:
            accum = max(1, t.batch_size * t.grad_accum_steps // batch)
            c = Candidate(batch, accum, t.resolved_precision_request(), t.compile)
        else:
            assert i is not None
            c = Candidate(batch, 1, i.precision, i.compile)
        result = prober(c)
        log.info(
            "probe at micro-batch %d: %s", batch, "out of memory" if result.oom else f"peak {result.mem_peak}"
        )
        return result.mem_peak, result.oom

    return probe


def _decisions(retunes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The decisions of the run's earlier retunes, oldest first (the ladder counts its rungs)."""
    return [
        r["evidence"]["decision"]
        for r in retunes
        if isinstance(r.get("evidence"), dict) and "decision" in r["evidence"]
    ]


def rank_events(events: Sequence[Mapping[str, Any]], end: AttemptEnd) -> list[Mapping[str, Any]]:
    """A gang's events as one process's: only the failed rank's (its `oom`, its progress and
    memory); events without a rank (every one-process run's, the daemon's) stay."""
    if end.world_size <= 1:
        return list(events)
    rank = end.rank
    if rank is None:  # decided again after a daemon restart: the rank its oom event names
        ooms = [e for e in events if e.get("attempt") == end.number and e.get("type") == "oom"]
        rank = ooms[0].get("rank") if ooms else None
    return [e for e in events if e.get("rank") is None or e.get("rank") == rank]


def _facts(end: AttemptEnd, events: Sequence[Mapping[str, Any]]) -> AttemptFacts:
    return AttemptFacts(
        number=end.number,
        events=[dict(e) for e in events],
        stderr_tail=end.stderr_tail,
        exit_code=end.exit_code,
        signal=end.signal,
        oom_kill=end.oom_kill,
        gpu_capacity=end.gpu_capacity,
        host_capacity=end.host_capacity,
    )


def _rank_gpus(end: AttemptEnd) -> list[str]:
    """The GPU of the rank that failed ([] on the CPU); all the attempt's GPUs when unknown."""
    if end.world_size > 1 and end.rank is not None and end.rank < len(end.gpus):
        return [end.gpus[end.rank]]
    return list(end.gpus)


def _rank_need(events: Sequence[Mapping[str, Any]], attempt: int) -> int | None:
    """The most GPU memory a rank of the attempt reserved (bytes), from its progress events."""
    peaks = [
        int(e[key])
        for e in events
        if e.get("attempt") == attempt and e.get("type") == "progress"
        for key in ("mem_reserved", "mem_peak")
        if isinstance(e.get(key), int)
    ]
    return max(peaks) if peaks else None


def _in_groups(pid: int, groups: set[int]) -> bool:
    try:
        return pid in groups or os.getpgid(pid) in groups
    except OSError:
        return False  # gone: its memory is released
