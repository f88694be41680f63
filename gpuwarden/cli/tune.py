"""`gpuwarden tune SPEC.yaml`: find the micro-batch (then precision, compile) with the best
throughput — or energy per sample, or both — for this machine, write the tuned spec, and remember
the answer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from gpuwarden.cli.format import note, print_json
from gpuwarden.cli.output_file import check_writable, writing
from gpuwarden.core.units import size

if TYPE_CHECKING:
    from gpuwarden.core.tune.objective import Objective
    from gpuwarden.core.tune.search import ProbeResult


@click.command()
@click.argument("spec_path", metavar="SPEC.yaml", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Tuned spec (default SPEC.tuned.yaml).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--force", is_flag=True, help="Probe again even if this setup was tuned before.")
@click.option("--max-trials", type=click.IntRange(1, 64), default=12, show_default=True,
              help="Most probe runs the search spends (each is a short real run); re-measuring a "
                   "pick that is within the noise of another adds at most 6.")  # fmt: skip
@click.option("--headroom", type=click.FloatRange(0.0, 0.5), default=0.08, show_default=True,
              help="Fraction of memory kept free.")  # fmt: skip
@click.option("--min-gain", type=click.FloatRange(0.0, 1.0), default=0.05, show_default=True,
              help="Stop when a larger micro-batch gains less than this.")  # fmt: skip
@click.option("--change-effective-batch", is_flag=True,
              help="Let the effective batch grow too (the learning rate is rescaled linearly).")  # fmt: skip
@click.option("--max-batch", type=click.IntRange(1), default=1024, show_default=True,
              help="Largest micro-batch to try.")  # fmt: skip
@click.option("--objective", type=click.Choice(["throughput", "energy", "balanced"]),
              help="What to maximise: samples/s, samples per joule, or samples/s per J/sample "
                   "(default: the spec's tune.objective, else throughput).")  # fmt: skip
@click.option("--power-sweep/--no-power-sweep", default=None,
              help="Also probe lower GPU power limits (root, or power_limit_command in the config); "
                   "the best limit is reported, not applied.")  # fmt: skip
def tune(  # Long: eleven options passed to tune_spec by name; the body is one session, then output
    spec_path: Path,
    output: Path | None,
    as_json: bool,
    force: bool,
    max_trials: int,
    headroom: float,
    min_gain: float,
    change_effective_batch: bool,
    max_batch: int,
    objective: Objective | None,
    power_sweep: bool | None,
) -> None:
    """Probe short runs to find the fastest (or most energy-efficient) settings that fit, and write
    a tuned spec."""
    from gpuwarden.core.config.resolve import moved_paths_note, resolve_relative_paths
    from gpuwarden.core.config.settings import load_settings
    from gpuwarden.core.config.spec import RunSpec, spec_from_document
    from gpuwarden.core.config.yamlsource import load_yaml_file
    from gpuwarden.core.telemetry.nvml import open_gpu_reader
    from gpuwarden.core.tune.cache import TuneCache
    from gpuwarden.core.tune.devices import tune_devices
    from gpuwarden.core.tune.session import tune_spec, tuned_section
    from gpuwarden.core.tune.target import pick_target
    from gpuwarden.core.tune.write import write_tuned_spec
    from gpuwarden.core.tune.written_outside import FolderFiles

    document = load_yaml_file(spec_path)
    with document.locating(RunSpec.model_fields):  # a policy file beside the spec is read here
        spec = resolve_relative_paths(spec_from_document(document), spec_path.resolve().parent)
    settings = load_settings()
    paths = settings.resolve_paths()
    out_path = output or spec_path.with_name(spec_path.stem + ".tuned.yaml")
    check_writable(out_path)

    def report(n: int, r: ProbeResult) -> None:
        if not as_json:
            note(probe_line(n, r))

    cwd = spec.command.cwd if spec.command is not None else None
    folder = FolderFiles.read(cwd) if cwd is not None else None  # what the program's probes may write over
    # The reader stays open while probing: it reads the GPU's energy counter (and sets its power
    # limit in a sweep).
    reader = open_gpu_reader()
    try:
        # Checks made on the validated spec (inputs, roles) name a key: placed at its line.
        with document.locating(RunSpec.model_fields):
            target = pick_target(spec, reader.gpus())

            def probing() -> None:
                if target.note and not as_json:
                    note(target.note)  # what the search covers on this device

            energy, limiter = tune_devices(reader, target, settings.power_limit_command)
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
                objective=objective,
                energy=energy,
                sweep_power=power_sweep,
                limiter=limiter,
            )
    finally:
        reader.close()
    if outcome.cached and not as_json:
        note(f"this setup was tuned before (fingerprint {outcome.fingerprint}); --force probes again")
    written = folder.written_note() if folder is not None and not outcome.cached else None
    section = tuned_section(spec)
    with writing(out_path):
        moved = write_tuned_spec(spec_path, out_path, section, outcome.knobs, "best: " + outcome.summary)
    if as_json:
        print_json(
            {
                "fingerprint": outcome.fingerprint,
                "cached": outcome.cached,
                "output": str(out_path),
                "knobs": outcome.knobs,
                "notes": ([moved_paths_note(list(moved), out_path.parent)] if moved else [])
                + ([written] if written else []),
                **outcome.result,
            }
        )
        return
    click.echo("best: " + outcome.summary)
    click.echo(f"wrote {out_path}")
    if moved:
        note(moved_paths_note(list(moved), out_path.parent))
    if written:
        note(written)


def probe_line(n: int, r: ProbeResult) -> str:
    """One probe as the user follows it: configuration, speed, energy, memory, time."""
    c = r.candidate
    what = f"probe {n}: micro-batch {c.batch_size} × {c.grad_accum_steps}, {c.precision}"
    what += ", compile" if c.compile else ""
    what += f", {c.power_limit_w:.0f} W limit" if c.power_limit_w is not None else ""
    if not r.ok or r.samples_per_s is None:
        return f"{what}: {'out of memory' if r.oom else r.error} ({r.wall_s:.0f} s)"
    energy = ""
    if r.joules_per_sample is not None:
        energy = f", {r.joules_per_sample:.4g} J/sample ({r.samples_per_kwh or 0:,.0f} samples/kWh)"
    peak = f"peak {size(r.mem_peak)}"
    return f"{what}: {r.samples_per_s:.2f} samples/s{energy}, {peak} ({r.wall_s:.0f} s)"


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)
