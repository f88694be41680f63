"""Probes of a user's own program: the program itself, run briefly with one candidate.

A probe is never a re-implementation. It is the run's own argv, config-file copy and
environment, prepared exactly as an attempt is (`prepare_attempt`), with only the knobs that play
a role changed: the micro-batch and accumulation to the candidate, `max_steps` to a few steps,
`output_dir` into the probe's own folder (nothing a probe writes can then pass for one of the
run's checkpoints). A restart after an out-of-memory is never probed this way: a probe is a start
of the program, as costly as the restart, so the restart measures its own size.

Peak memory comes from the program's progress events (the SDK or a framework callback) when it
sends any, else from the process itself (`process_peak`): its address-space high-water mark
under a memory limit, the GPU memory its process group holds where a reader is given, its peak
RSS otherwise.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwarden.core.command.prepare import prepare_attempt
from gpuwarden.core.command.record import attempt_dir
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.config.templating import BUILTINS, render, template_values
from gpuwarden.core.errors import UserError
from gpuwarden.core.events import EXIT_OOM, decode
from gpuwarden.core.oom.classify import classify_text
from gpuwarden.core.rlimit import limited_argv
from gpuwarden.core.tune.process_peak import GpuUsed, Watched, run_watched
from gpuwarden.core.tune.search import Candidate, ProbeResult

_TAIL_BYTES = 64 * 1024
# Rendered in place of the run folder to see where a program would write.
_SENTINEL = os.path.join(os.sep, "gpuwarden-probe-folder")


def _writes_into_run_dir(spec: RunSpec) -> bool:
    """Whether the program's checkpoints land under the run's folder (so a probe's land under
    the probe's): `{run_dir}` in the checkpoint pattern, or no working directory of its own."""
    assert spec.command is not None
    checkpoints = spec.command.checkpoints
    if checkpoints is None:
        return False
    values = template_values(spec, {**dict.fromkeys(BUILTINS, ""), "run_dir": _SENTINEL})
    try:
        pattern = render(checkpoints.glob, values, "command.checkpoints.glob")
    except UserError:
        return False
    cwd = str(spec.command.cwd) if spec.command.cwd is not None else _SENTINEL
    return os.path.normpath(os.path.join(cwd, pattern)).startswith(_SENTINEL + os.sep)


def probe_blocker(spec: RunSpec) -> str | None:
    """What a command run's spec must name before its program can be probed (None: nothing)."""
    if spec.command is None:
        return "it is not a command run"
    names = spec.command.roles.knob_names()
    if "micro_batch" not in names:
        return "name the knob that is the micro-batch (command.roles.micro_batch)"
    if "max_steps" not in names:
        return (
            "name the knob that sets the number of optimizer steps (command.roles.max_steps), "
            "so a probe can stop after a few"
        )
    if "output_dir" not in names and not _writes_into_run_dir(spec):
        return (
            "name the knob that says where the program writes (command.roles.output_dir), so a "
            "probe's checkpoints stay in the probe's own folder"
        )
    return None


def _lines(path: Path) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - _TAIL_BYTES))
            return fh.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []


class CommandProber:
    """Callable(Candidate) -> ProbeResult running the user's program once per call."""

    def __init__(
        self,
        spec: RunSpec,
        work_dir: Path,
        *,
        env: dict[str, str] | None = None,
        warmup_steps: int = 2,
        measure_steps: int = 3,
        timeout_s: float = 900.0,
        on_result: Callable[[int, ProbeResult], None] | None = None,
        on_gpu: bool = False,
        gpu_used: GpuUsed | None = None,
    ) -> None:
        blocker = probe_blocker(spec)
        if blocker is not None:
            raise UserError(f"{spec.name}: cannot probe this program: {blocker}")
        assert spec.command is not None
        self.spec = spec
        self.roles = spec.command.roles.knob_names()
        self.work_dir = work_dir
        self.env = env
        self.warmup_steps = warmup_steps
        self.measure_steps = measure_steps
        self.timeout_s = timeout_s
        self.on_result = on_result
        self.on_gpu = on_gpu
        self.gpu_used = gpu_used
        self.count = 0

    def steps(self) -> int:
        """The probe's `max_steps`: its warm-up and measured steps."""
        return self.warmup_steps + self.measure_steps

    def probe_spec(self, c: Candidate, folder: Path) -> RunSpec:
        """The run's spec with the role knobs set for this candidate and this probe."""
        knobs: dict[str, Any] = dict(self.spec.knobs)
        knobs[self.roles["micro_batch"]] = c.batch_size
        if "accum_steps" in self.roles:
            knobs[self.roles["accum_steps"]] = c.grad_accum_steps
        if "precision" in self.roles and c.precision != "auto":
            knobs[self.roles["precision"]] = c.precision
        knobs[self.roles["max_steps"]] = self.steps()
        if "output_dir" in self.roles:
            knobs[self.roles["output_dir"]] = str(folder / "output")
        return self.spec.model_copy(update={"knobs": knobs})

    def __call__(self, c: Candidate) -> ProbeResult:
        self.count += 1
        folder = self.work_dir / f"probe-{self.count}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        spec = self.probe_spec(c, folder)
        prepared = prepare_attempt(spec, f"probe-{self.count}", folder, 1)
        env = dict(os.environ if self.env is None else self.env)
        env.update(self.spec.env)
        env.update(prepared.env)
        env.update(self.spec.env)  # as the daemon starts an attempt: the run's env goes last
        limit = self.spec.resources.memory_limit
        logs = attempt_dir(folder, 1)
        watched = run_watched(
            limited_argv(prepared.argv, int(limit) if limit else None),
            cwd=prepared.cwd,
            env=env,
            stdout=logs / "stdout.log",
            stderr=logs / "stderr.log",
            timeout_s=self.timeout_s,
            gpu_used=self.gpu_used,
        )
        result = self._result(c, watched, logs)
        if self.on_result is not None:
            self.on_result(self.count, result)
        return result

    def _result(self, c: Candidate, watched: Watched, logs: Path) -> ProbeResult:
        events = [e for e in map(decode, _lines(logs / "events.jsonl")) if e is not None]
        progress = [e for e in events if e["type"] == "progress"]
        peak = self._peak(progress, watched)
        code, wall = watched.exit_code, watched.wall_s
        if code is None:
            return ProbeResult(c, ok=False, mem_peak=peak, wall_s=wall, error=f"timed out after {wall:.0f} s")
        tail = _lines(logs / "stderr.log")
        if code == EXIT_OOM or any(e["type"] == "oom" for e in events):
            return ProbeResult(c, ok=False, oom=True, mem_peak=peak, wall_s=wall)
        if code != 0:
            text = "\n".join(tail)
            if classify_text(text, exit_code=code, signal=watched.signal).is_oom:
                return ProbeResult(c, ok=False, oom=True, mem_peak=peak, wall_s=wall)
            last = next((line for line in reversed(tail) if line.strip()), f"exit {code}")
            return ProbeResult(c, ok=False, mem_peak=peak, wall_s=wall, error=last[:300])
        return ProbeResult(
            c, ok=True, samples_per_s=self._throughput(progress, c, wall), mem_peak=peak, wall_s=wall
        )

    def _peak(self, progress: list[dict[str, Any]], watched: Watched) -> int | None:
        limited = self.spec.resources.memory_limit is not None
        key = "vm_peak" if limited and any("vm_peak" in e for e in progress) else "mem_peak"
        reported = [int(e[key]) for e in progress if isinstance(e.get(key), int | float)]
        if reported:
            return max(reported)
        if limited:
            return watched.vm_peak  # what the address-space limit counts
        return watched.gpu_peak if self.on_gpu else watched.rss_peak

    def _throughput(self, progress: list[dict[str, Any]], c: Candidate, wall: float) -> float | None:
        """Samples/s between the warm-up's end and the last reported step; without progress
        events, over the whole probe (start-up included: a lower figure, alike for every
        candidate)."""
        after = [e for e in progress if int(e.get("step", 0)) >= self.warmup_steps]
        if len(after) >= 2:
            first, last = after[0], after[-1]
            dt = float(last["ts"]) - float(first["ts"])
            ds = int(last["samples_seen"]) - int(first["samples_seen"])
            if dt > 0 and ds > 0:
                return ds / dt
        samples = self.steps() * c.batch_size * c.grad_accum_steps
        return samples / wall if wall > 0 else None


__all__ = ["CommandProber", "probe_blocker"]
