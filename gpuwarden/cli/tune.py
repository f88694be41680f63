"""`gpuwarden tune SPEC.yaml`: find the micro-batch (then precision, compile) with the best
throughput for this machine, write the tuned spec, and remember the answer."""

from __future__ import annotations

from pathlib import Path

import click

from gpuwarden.cli.format import note, print_json
from gpuwarden.core.units import size


@click.command()
@click.argument("spec_path", metavar="SPEC.yaml", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Tuned spec (default SPEC.tuned.yaml).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--force", is_flag=True, help="Probe again even if this setup was tuned before.")
@click.option("--max-trials", type=click.IntRange(1, 64), default=12, show_default=True,
              help="Most probe runs to spend (each is a short real run).")  # fmt: skip
@click.option("--headroom", type=click.FloatRange(0.0, 0.5), default=0.08, show_default=True,
              help="Fraction of memory kept free.")  # fmt: skip
@click.option("--min-gain", type=click.FloatRange(0.0, 1.0), default=0.05, show_default=True,
              help="Stop when a larger micro-batch gains less than this.")  # fmt: skip
@click.option("--change-effective-batch", is_flag=True,
              help="Let the effective batch grow too (the learning rate is rescaled linearly).")  # fmt: skip
@click.option("--max-batch", type=click.IntRange(1), default=1024, show_default=True,
              help="Largest micro-batch to try.")  # fmt: skip
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
) -> None:
    """Probe short runs to find the fastest settings that fit, and write a tuned spec."""
    from gpuwarden.core.config.resolve import resolve_relative_paths
    from gpuwarden.core.config.settings import load_settings
    from gpuwarden.core.config.spec import load_spec
    from gpuwarden.core.telemetry.nvml import open_gpu_reader
    from gpuwarden.core.tune.cache import TuneCache
    from gpuwarden.core.tune.search import ProbeResult
    from gpuwarden.core.tune.session import tune_spec
    from gpuwarden.core.tune.target import pick_target
    from gpuwarden.core.tune.write import write_tuned_spec

    spec = resolve_relative_paths(load_spec(spec_path), spec_path.resolve().parent)
    reader = open_gpu_reader()
    try:
        gpus = reader.gpus()
    finally:
        reader.close()
    target = pick_target(spec, gpus)
    paths = load_settings().resolve_paths()
    out_path = output or spec_path.with_name(spec_path.stem + ".tuned.yaml")

    def report(n: int, r: ProbeResult) -> None:
        if as_json:
            return
        c = r.candidate
        what = f"probe {n}: micro-batch {c.batch_size} × {c.grad_accum_steps}, {c.precision}"
        what += ", compile" if c.compile else ""
        if r.ok and r.samples_per_s is not None:
            rate = f"{r.samples_per_s:.2f} samples/s"
            note(f"{what}: {rate}, peak {size(r.mem_peak)} ({r.wall_s:.0f} s)")
        else:
            note(f"{what}: {'out of memory' if r.oom else r.error} ({r.wall_s:.0f} s)")

    def probing() -> None:
        if target.note and not as_json:
            note(target.note)  # what the search covers on this device

    outcome = tune_spec(
        spec,
        target,
        TuneCache(paths.tune_cache),
        paths.state_dir,
        env=_environ(),
        force=force,
        max_trials=max_trials,
        headroom=headroom,
        min_gain=min_gain,
        change_effective_batch=change_effective_batch,
        max_batch=max_batch,
        on_result=report,
        on_probing=probing,
        label=str(spec_path),
    )
    if outcome.cached and not as_json:
        note(f"this setup was tuned before (fingerprint {outcome.fingerprint}); --force probes again")
    section = "train" if spec.train is not None else "infer"
    write_tuned_spec(spec_path, out_path, section, outcome.knobs, "best: " + outcome.summary)
    if as_json:
        print_json(
            {
                "fingerprint": outcome.fingerprint,
                "cached": outcome.cached,
                "output": str(out_path),
                "knobs": outcome.knobs,
                **outcome.result,
            }
        )
        return
    click.echo("best: " + outcome.summary)
    click.echo(f"wrote {out_path}")


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)
