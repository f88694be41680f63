"""Probe processes: a short run of the real runner with one candidate configuration.

A probe is the runner itself (`python -m gpuwarden.runners`), not an in-process imitation, so it
measures what a real run will do: the same data path, the same allocator, the optimizer state
created on the first step. Worst-case shapes: causal-LM probes pack texts into full
`max_length` blocks; generation probes use the longest prompts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.events import EXIT_OOM, decode
from gpuwarden.core.rlimit import limited_argv
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
        self.count = 0

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
                max_steps=self.warmup_steps + self.measure_steps,
                log_interval=1,  # a sync per step is fine here: probes measure, they do not train
                checkpoint_interval=10**9,
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
        try:
            lines = [
                json.loads(line) for line in self.spec.infer.input.read_text().splitlines() if line.strip()
            ]
        except (OSError, ValueError) as exc:
            raise UserError(
                f"{self.spec.infer.input}: cannot read the prompts ({exc}) — check `infer.input`"
            ) from None
        if not lines:
            raise UserError(f"{self.spec.infer.input}: no prompts to probe with")
        lines.sort(key=lambda d: len(str(d.get(field, ""))) if isinstance(d, dict) else 0, reverse=True)
        chosen = [dict(lines[k % len(lines)], id=f"probe-{k}") for k in range(n)]
        path = run_dir / "probe-prompts.jsonl"
        path.write_text("".join(json.dumps(d) + "\n" for d in chosen))
        return path

    def __call__(self, c: Candidate) -> ProbeResult:
        self.count += 1
        run_dir = self.work_dir / f"probe-{self.count}"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        spec_path = run_dir / "probe.yaml"
        spec_path.write_text(yaml.safe_dump(self._probe_spec(c, run_dir), sort_keys=False))
        events_path = run_dir / "events.jsonl"
        argv = [
            sys.executable,
            "-m",
            "gpuwarden.runners",
            "--spec",
            str(spec_path),
            "--run-dir",
            str(run_dir),
        ]
        argv += ["--attempt", "1", "--events", str(events_path)]
        env = dict(os.environ if self.env is None else self.env)
        limit = self.spec.resources.memory_limit
        argv = limited_argv(argv, int(limit) if limit else None)
        start = time.monotonic()
        with open(run_dir / "stderr.log", "wb") as err, open(run_dir / "stdout.log", "wb") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,
            )
            try:
                code = proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
        result = self._result(c, code, events_path, run_dir, time.monotonic() - start)
        if self.on_result is not None:
            self.on_result(self.count, result)
        return result

    def _result(
        self, c: Candidate, code: int | None, events_path: Path, run_dir: Path, wall: float
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
            tail = _read_lines(run_dir / "stderr.log")[-1:] or [f"exit {code}"]
            return ProbeResult(c, ok=False, wall_s=wall, error=(errors or tail)[-1][:300])
        return ProbeResult(
            c, ok=True, samples_per_s=self._throughput(progress), mem_peak=mem_peak, wall_s=wall
        )

    def _throughput(self, progress: list[dict[str, Any]]) -> float | None:
        """Samples/s between the end of the warm-up and the last step, from event timestamps."""
        after = [e for e in progress if int(e.get("step", 0)) >= self.warmup_steps]
        if len(after) >= 2:
            first, last = after[0], after[-1]
            dt = float(last["ts"]) - float(first["ts"])
            ds = int(last["samples_seen"]) - int(first["samples_seen"])
            if dt > 0 and ds > 0:
                return ds / dt
        rates = [float(e["samples_per_s"]) for e in progress if e.get("samples_per_s")]
        return rates[-1] if rates else None


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []
