"""`gpuwarden tune SPEC.yaml`: find the micro-batch (then precision, compile) with the best
throughput for this machine, write the tuned spec, and remember the answer."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import click

from gpuwarden.cli.format import gib, note, print_json
from gpuwarden.core.errors import UserError


@click.command()
@click.argument("spec_path", metavar="SPEC.yaml", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Tuned spec (default SPEC.tuned.yaml).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--force", is_flag=True, help="Probe again even if this setup was tuned before.")
@click.option("--max-trials", type=click.IntRange(1, 64), default=12, show_default=True)
@click.option("--headroom", type=click.FloatRange(0.0, 0.5), default=0.08, show_default=True,
              help="Fraction of memory kept free.")  # fmt: skip
@click.option("--min-gain", type=click.FloatRange(0.0, 1.0), default=0.05, show_default=True,
              help="Stop when a larger micro-batch gains less than this.")  # fmt: skip
@click.option("--change-effective-batch", is_flag=True,
              help="Let the effective batch grow too (the learning rate is rescaled linearly).")  # fmt: skip
@click.option("--max-batch", type=click.IntRange(1), default=1024, show_default=True)
@click.option("--keep-probes", is_flag=True, help="Keep the probe run directories.")
def tune(
    spec_path: Path,
    output: Path | None,
    as_json: bool,
    force: bool,
    max_trials: int,
    headroom: float,
    min_gain: float,
    change_effective_batch: bool,
    max_batch: int,
    keep_probes: bool,
) -> None:
    """Probe short runs to find the fastest settings that fit, and write a tuned spec."""
    from gpuwarden.core.config.resolve import resolve_relative_paths
    from gpuwarden.core.config.settings import load_settings
    from gpuwarden.core.config.spec import load_spec
    from gpuwarden.core.telemetry.nvml import open_gpu_reader
    from gpuwarden.core.tune.cache import TuneCache
    from gpuwarden.core.tune.fingerprint import fingerprint, fingerprint_inputs
    from gpuwarden.core.tune.probe import SubprocessProber
    from gpuwarden.core.tune.search import Candidate, ProbeResult, Search
    from gpuwarden.core.tune.target import pick_target
    from gpuwarden.core.tune.write import write_tuned_spec

    spec = resolve_relative_paths(load_spec(spec_path), spec_path.resolve().parent)
    reader = open_gpu_reader()
    try:
        gpus = reader.gpus()
    finally:
        reader.close()
    target = pick_target(spec, gpus)
    inputs = fingerprint_inputs(spec, target.device)
    fp = fingerprint(inputs)
    paths = load_settings().resolve_paths()
    cache = TuneCache(paths.tune_cache)
    out_path = output or spec_path.with_name(spec_path.stem + ".tuned.yaml")
    section = "train" if spec.train is not None else "infer"

    cached = None if force else cache.get(fp)
    if cached is not None:
        knobs: dict[str, Any] = cached["knobs"]
        result: dict[str, Any] = cached["result"]
        if not as_json:
            note(f"this setup was tuned before (fingerprint {fp}); --force probes again")
    else:
        if target.note and not as_json:
            note(target.note)
        if spec.train is not None:
            t = spec.train
            start = Candidate(t.batch_size, t.grad_accum_steps, t.resolved_precision_request(), t.compile)
            per_device = None if change_effective_batch else t.batch_size * t.grad_accum_steps
        else:
            assert spec.infer is not None
            i = spec.infer
            start = Candidate(i.batch_size, 1, i.precision, i.compile)
            per_device = None

        def report(n: int, r: ProbeResult) -> None:
            if as_json:
                return
            c = r.candidate
            what = f"probe {n}: micro-batch {c.batch_size} × {c.grad_accum_steps}, {c.precision}"
            what += ", compile" if c.compile else ""
            if r.ok and r.samples_per_s is not None:
                rate = f"{r.samples_per_s:.2f} samples/s"
                note(f"{what}: {rate}, peak {gib(r.mem_peak, 2)} GiB ({r.wall_s:.0f} s)")
            else:
                note(f"{what}: {'out of memory' if r.oom else r.error} ({r.wall_s:.0f} s)")

        work = Path(tempfile.mkdtemp(prefix=f"tune-{fp[:8]}-", dir=_ensure(paths.state_dir)))
        try:
            prober = SubprocessProber(spec, work, env={**_environ(), **target.env}, on_result=report)
            search = Search(
                prober, capacity=target.capacity, headroom=headroom, min_gain=min_gain, max_trials=max_trials
            )
            outcome = search.run(
                start,
                per_device_batch=per_device,
                max_batch=max_batch,
                precisions=target.precisions,
                compile_options=target.compile_options,
            )
        finally:
            if not keep_probes:
                shutil.rmtree(work, ignore_errors=True)
        if outcome.best is None:
            raise UserError(
                f"{spec_path}: no configuration ran: {outcome.stopped_because} — see the probe lines above"
            )
        result = outcome.to_dict()
        knobs = _knobs(spec, outcome.best.candidate, change_effective_batch)
        cache.put(fp, inputs, result, knobs)

    best = result["best"]
    summary = (
        f"best: micro-batch {best['candidate']['batch_size']} × {best['candidate']['grad_accum_steps']}, "
        f"{best['candidate']['precision']}{', compile' if best['candidate']['compile'] else ''}: "
        f"{best['samples_per_s']:.2f} samples/s; {len(result['trials'])} probes; "
        f"stopped: {result['stopped_because']}"
    )
    write_tuned_spec(spec_path, out_path, section, knobs, summary)
    if as_json:
        print_json(
            {
                "fingerprint": fp,
                "cached": cached is not None,
                "output": str(out_path),
                "knobs": knobs,
                **result,
            }
        )
        return
    click.echo(summary)
    click.echo(f"wrote {out_path}")


def _knobs(spec: Any, c: Any, change_effective_batch: bool) -> dict[str, Any]:
    if spec.train is None:
        return {"batch_size": c.batch_size, "precision": c.precision, "compile": c.compile}
    t = spec.train
    knobs: dict[str, Any] = {
        "batch_size": c.batch_size,
        "grad_accum_steps": c.grad_accum_steps,
        "precision": c.precision,
        "compile": c.compile,
    }
    new_effective = c.batch_size * c.grad_accum_steps * t.world_size
    if change_effective_batch and new_effective != t.effective_batch:
        # Linear scaling rule: the learning rate follows the effective batch.
        optimizer = t.optimizer.model_dump(mode="json")
        optimizer["lr"] = t.optimizer.lr * new_effective / t.effective_batch
        knobs["optimizer"] = optimizer
    return knobs


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


def _ensure(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p
