"""Probe processes: a short run of the real runner with one candidate configuration.

A probe is the runner itself (`python -m gpuwarden.runners`), not an in-process imitation, so it
measures what a real run will do: the same data path, the same allocator, the optimizer state
created on the first step. Worst-case shapes: causal-LM probes pack texts into full
`max_length` blocks; generation probes use the longest prompts. With an energy counter for the
probe's GPU, each probe also gives joules per sample over its measured steps (`energy.py`).

A probe for a restart (`resume_from`) starts from the run's own newest checkpoint, as the
restarted attempt will: loading the model, optimizer and RNG state costs memory too. With
`include_saves` it also writes a checkpoint between its two steps, so the peak it reports covers
serialising the state as well (on the host, where saving allocates).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.core.checkpoints import checkpoint_step, link_checkpoint
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.events import EXIT_OOM, EXIT_USER_ERROR, decode
from gpuwarden.core.rlimit import limited_argv
from gpuwarden.core.tune.energy import EnergyCounter, EnergyTrace
from gpuwarden.core.tune.probe_process import ProbeProcesses, SizeRequest
from gpuwarden.core.tune.search import Candidate, ProbeResult


class SubprocessProber:
    """Callable(Candidate) -> ProbeResult running one probe process per call."""

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
        resume_from: Path | None = None,
        include_saves: bool = False,
        energy: EnergyCounter | None = None,
        session: bool = False,
    ) -> None:
        tunable = spec.train is not None or (spec.infer is not None and spec.infer.task == "generate")
        if not tunable:
            raise UserError(
                f"{spec.name}: gpuwarden tune handles training runs and `generate` inference — "
                "this spec's kind/task has no batch size to tune"
            )
        self.spec = spec
        self.work_dir = work_dir
        self.env = env
        self.warmup_steps = warmup_steps
        self.measure_steps = measure_steps
        self.timeout_s = timeout_s
        self.on_result = on_result
        self.resume_from = resume_from if spec.train is not None else None
        self.include_saves = include_saves
        # Steps continue from the checkpoint's: the probe's own steps come after it.
        self.first_step = checkpoint_step(self.resume_from) if self.resume_from is not None else 0
        self.energy = energy
        self.count = 0
        # Probes in one process that imports once (and builds a training run's model once:
        # `probe_process.py`); probes asked for one by one each start the runner afresh.
        self._session: ProbeProcesses | None = None
        if session:
            limit = spec.resources.memory_limit
            stderr = work_dir / "session-stderr.log"
            self._session = ProbeProcesses(self._env(), int(limit) if limit else None, stderr)
        self._launched = 0

    @property
    def processes(self) -> int:
        """Probe processes started so far."""
        return self._session.started if self._session is not None else self._launched

    def close(self) -> None:
        """End the probe process still alive, if any (a session waits for its next size)."""
        if self._session is not None:
            self._session.close()

    def _env(self) -> dict[str, str]:
        return dict(os.environ if self.env is None else self.env)

    def _probe_spec(self, c: Candidate, run_dir: Path) -> dict[str, Any]:
        data = self.spec.model_dump(mode="json", exclude_none=True)
        data["name"] = f"{self.spec.name[:50]}-probe{self.count}"
        data.pop("autotune", None)
        if self.spec.train is not None:
            t = data["train"]
            t.update(
                batch_size=c.batch_size,
                grad_accum_steps=c.grad_accum_steps,
                precision=c.precision,
                compile=c.compile,
                max_steps=self.first_step + self.warmup_steps + self.measure_steps,
                log_interval=1,  # a sync per step is fine here: probes measure, they do not train
                checkpoint_interval=1 if self.include_saves else 10**9,
                keep_checkpoints=1,
            )
            t.pop("amp", None)
            if self.spec.train.world_size > 1:
                # One rank's memory: a probe is one process on one device (DDP's gradient
                # buckets aside, a rank holds what a single process at its micro-batch holds).
                t["world_size"] = 1
                resources = data.setdefault("resources", {})
                if resources.get("gpus", 1) != 0:
                    resources["gpus"] = 1
            if self.spec.train.task == "causal_lm":
                t["packing"] = True  # every block full length: the worst case for memory
        else:
            assert self.spec.infer is not None
            i = data["infer"]
            items = c.batch_size * (self.warmup_steps + self.measure_steps)
            i.update(
                batch_size=c.batch_size,
                precision=c.precision,
                compile=c.compile,
                input=str(self._longest_prompts(items, run_dir)),
                output=str(run_dir / "outputs.jsonl"),
            )
        return data

    def _longest_prompts(self, n: int, run_dir: Path) -> Path:
        assert self.spec.infer is not None
        field = self.spec.infer.prompt_field
        lines = _read_prompts(self.spec.infer.input, field)
        lines.sort(key=lambda d: len(d[field]), reverse=True)
        chosen = [dict(lines[k % len(lines)], id=f"probe-{k}") for k in range(n)]
        path = run_dir / "probe-prompts.jsonl"
        path.write_text("".join(json.dumps(d) + "\n" for d in chosen))
        return path

    def __call__(self, c: Candidate) -> ProbeResult:
        self.count += 1
        run_dir = self.work_dir / f"probe-{self.count}"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        if self.resume_from is not None:
            link_checkpoint(self.resume_from, run_dir / "checkpoints")
        spec_path = run_dir / "probe.yaml"
        spec_path.write_text(yaml.safe_dump(self._probe_spec(c, run_dir), sort_keys=False))
        events_path = run_dir / "events.jsonl"
        start = time.monotonic()
        trace = EnergyTrace(self.energy) if self.energy is not None else None
        with trace if trace is not None else contextlib.nullcontext():
            if self._session is not None:
                request = SizeRequest(spec_path, run_dir, events_path)
                code = self._session.measure(request, self.timeout_s)
            else:
                code = self._launch(spec_path, run_dir, events_path)
        result = self._result(c, code, events_path, run_dir, time.monotonic() - start, trace)
        if self.on_result is not None:
            self.on_result(self.count, result)
        return result

    def _launch(self, spec_path: Path, run_dir: Path, events_path: Path) -> int | None:
        """One runner process for this probe alone; its exit status (None: killed at the timeout)."""
        argv = [sys.executable, "-m", "gpuwarden.runners", "--spec", str(spec_path)]
        argv += ["--run-dir", str(run_dir), "--attempt", "1", "--events", str(events_path)]
        limit = self.spec.resources.memory_limit
        argv = limited_argv(argv, int(limit) if limit else None)
        self._launched += 1
        with open(run_dir / "stderr.log", "wb") as err, open(run_dir / "stdout.log", "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, env=self._env(), start_new_session=True)
            try:
                return proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return None

    def _result(
        self,
        c: Candidate,
        code: int | None,
        events_path: Path,
        run_dir: Path,
        wall: float,
        trace: EnergyTrace | None = None,
    ) -> ProbeResult:
        events = [e for e in (decode(line) for line in _read_lines(events_path)) if e is not None]
        progress = [e for e in events if e["type"] == "progress"]
        oom = code == EXIT_OOM or any(e["type"] == "oom" for e in events)
        # Under an address-space limit (CPU runs) the peak that matters is the address space.
        key = (
            "vm_peak"
            if self.spec.resources.memory_limit and any("vm_peak" in e for e in progress)
            else "mem_peak"
        )
        peaks = [int(e[key]) for e in progress if isinstance(e.get(key), int | float)]
        mem_peak = max(peaks) if peaks else None
        if oom:
            return ProbeResult(c, ok=False, oom=True, mem_peak=mem_peak, wall_s=wall)
        if code is None:
            return ProbeResult(c, ok=False, wall_s=wall, error=f"timed out after {self.timeout_s:.0f} s")
        if code != 0:
            errors = [str(e.get("message")) for e in events if e["type"] == "error"]
            stderr = run_dir / "stderr.log" if self._session is None else self.work_dir / "session-stderr.log"
            tail = _read_lines(stderr)[-1:] or [f"exit {code}"]
            error = (errors or tail)[-1][:300]
            return ProbeResult(c, ok=False, wall_s=wall, error=error, spec_error=code == EXIT_USER_ERROR)
        measured = self._measured(progress)
        joules = power = None
        if measured is not None and trace is not None:
            (t0, t1), samples = measured
            spent = trace.joules(t0, t1)
            if spent is not None and spent >= 0:
                joules, power = spent / samples, spent / (t1 - t0)
        return ProbeResult(
            c,
            ok=True,
            samples_per_s=self._throughput(progress, measured),
            mem_peak=mem_peak,
            wall_s=wall,
            joules_per_sample=joules,
            power_w=power,
            step_spread=_step_spread(self._after_warmup(progress)),
        )

    def _after_warmup(self, progress: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [e for e in progress if int(e.get("step", 0)) >= self.first_step + self.warmup_steps]

    def _measured(self, progress: list[dict[str, Any]]) -> tuple[tuple[float, float], int] | None:
        """((start, end) of the measured steps, samples done in them), from event timestamps."""
        after = self._after_warmup(progress)
        if len(after) < 2:
            return None
        first, last = after[0], after[-1]
        t0, t1 = float(first["ts"]), float(last["ts"])
        samples = int(last["samples_seen"]) - int(first["samples_seen"])
        return ((t0, t1), samples) if t1 > t0 and samples > 0 else None

    def _throughput(
        self, progress: list[dict[str, Any]], measured: tuple[tuple[float, float], int] | None
    ) -> float | None:
        """Samples/s over the measured steps; the runner's own figure when they cannot say."""
        if measured is not None:
            (t0, t1), samples = measured
            return samples / (t1 - t0)
        rates = [float(e["samples_per_s"]) for e in progress if e.get("samples_per_s")]
        return rates[-1] if rates else None


def _read_prompts(path: Path, field: str) -> list[dict[str, Any]]:
    """The prompts' objects. The probes run a copy, longest first: a line the runner would refuse
    is named here in the user's own file (the copy's line numbers are not theirs)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read the prompts ({exc}) — check `infer.input`") from None
    lines: list[dict[str, Any]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError as exc:
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise UserError(f"{path}:{number}: not valid JSON ({msg}) — one JSON object per line") from None
        except RecursionError:
            raise UserError(f"{path}:{number}: JSON nested too deeply") from None
        if not isinstance(line, dict):
            raise UserError(f"{path}:{number}: expected a JSON object, got {type(line).__name__}")
        if not isinstance(line.get(field), str):
            raise UserError(
                f"{path}:{number}: no string field '{field}' — set infer.prompt_field to the field "
                f"holding the prompt (this line has: {', '.join(sorted(line)) or 'no fields'})"
            )
        lines.append(line)
    if not lines:
        raise UserError(f"{path}: no prompts to probe with")
    return lines


def _step_spread(events: list[dict[str, Any]]) -> float | None:
    """(fastest − slowest) / median of the per-step rates between consecutive events: the noise
    inside one probe (None with fewer than two intervals)."""
    rates = []
    for prev, cur in itertools.pairwise(events):
        dt = float(cur["ts"]) - float(prev["ts"])
        ds = int(cur["samples_seen"]) - int(prev["samples_seen"])
        if dt > 0 and ds > 0:
            rates.append(ds / dt)
    if len(rates) < 2:
        return None
    return (max(rates) - min(rates)) / statistics.median(rates)


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []
