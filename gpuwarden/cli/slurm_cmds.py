"""`gpuwarden slurm submit|cancel`: a run as a Slurm batch job that survives its own failures.

    gpuwarden slurm submit SPEC.yaml [--nodes N] [OPTIONS] [-- SBATCH_OPTIONS…]
    gpuwarden slurm submit [OPTIONS] [RUN'S OPTIONS] -- CMD ARGS…     (sbatch options: --sbatch OPT)
    gpuwarden slurm cancel RUN [--runs DIR]

`submit` makes the run's folder, writes the spec the job runs (`job.yaml`, its paths made
absolute) and a readable batch script (`job.sbatch`) beside it, and submits the script. The job
runs `gpuwarden exec`: an out-of-memory failure is retuned inside the allocation; Slurm's warning
before the time limit (SIGUSR1) or a preemption (SIGTERM) stops the run at a checkpoint and the job
queues itself again (`scontrol requeue`, up to --max-requeues times), and its next start goes on
from that checkpoint. With `--nodes N` the script `srun`s one `gpuwarden exec` per node: node 0
supervises the run, the others start their ranks from its plan (`docs/clusters.md`).
`gpuwarden ps --runs DIR` lists it with the job's state.
"""

from __future__ import annotations

import shutil
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import click
import yaml

from gpuwarden.cli.command_spec import command_options
from gpuwarden.cli.format import print_json
from gpuwarden.cli.run_source import runs_option
from gpuwarden.cli.spec_input import spec_of
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.private import make_dirs
from gpuwarden.core.run_ref import new_run_id
from gpuwarden.slurm.record import SCRIPT_NAME, SPEC_NAME, SlurmRecord, records
from gpuwarden.slurm.sbatch import SbatchOptions, sbatch_script

DEFAULT_RUNS = Path("gpuwarden-runs")
DEFAULT_LEAD_S = 300
DEFAULT_REQUEUES = 10


@click.group()
def slurm() -> None:
    """Run as a Slurm batch job: OOM retuned inside it, requeued at its time limit."""


@slurm.command("submit")
@click.argument("words", nargs=-1, metavar="SPEC.yaml [-- SBATCH_OPTIONS] | -- CMD [ARGS]...")
@click.option(
    "--runs",
    "runs_root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The folder the run's folder goes in (default: ./gpuwarden-runs).",
)
@click.option(
    "--time", "time_limit", default=None, help="The job's time limit: MINUTES, HH:MM:SS or D-HH:MM:SS."
)
@click.option(
    "--nodes",
    type=click.IntRange(1, 1024),
    default=None,
    help="Nodes the run spans (its resources.nodes): srun starts one gpuwarden exec on each.",
)
@click.option("--gpus-per-node", type=click.IntRange(1, 64), default=None, help="GPUs on each node.")
@click.option("--partition", default=None, help="The partition (queue) to run in.")
@click.option("--job-name", default=None, help="The name squeue shows (default: the run's name).")
@click.option(
    "--signal-lead",
    "lead_s",
    type=click.IntRange(1, 65535),
    default=None,
    help=f"Seconds before the time limit the run is told to checkpoint (default {DEFAULT_LEAD_S}).",
)
@click.option(
    "--max-requeues",
    type=click.IntRange(0, 1000),
    default=DEFAULT_REQUEUES,
    show_default=True,
    help="Times the job may queue itself again after stopping at a checkpoint.",
)
@click.option(
    "--sbatch",
    "sbatch_extra",
    multiple=True,
    metavar="OPTION",
    help="A raw sbatch option for a command run (repeatable): --sbatch=--qos=high.",
)
@command_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON (and nothing else) on stdout.")
def submit(
    words: tuple[str, ...],
    runs_root: Path | None,
    time_limit: str | None,
    nodes: int | None,
    gpus_per_node: int | None,
    partition: str | None,
    job_name: str | None,
    lead_s: int | None,
    max_requeues: int,
    sbatch_extra: tuple[str, ...],
    as_json: bool,
    **flags: Any,
) -> None:
    """Submit a spec (or your own command) as a Slurm batch job that gpuwarden supervises."""
    from gpuwarden.slurm.scheduler import submit as sbatch

    if not words:
        raise UserError("give a spec (gpuwarden slurm submit SPEC.yaml) or a command (… -- CMD ARGS…)")
    spec_words, extra = _split(words)
    _one_node((*extra, *sbatch_extra))
    spec, _, _ = spec_of(spec_words, flags, "slurm submit", nodes)
    limit = parse_time(time_limit) if time_limit is not None else None
    folder = (runs_root or DEFAULT_RUNS).absolute() / new_run_id()
    options = SbatchOptions(
        job_name=job_name or spec.name,
        output=str(folder / "slurm-%j.out"),
        time=limit,
        nodes=spec.resources.nodes,
        gpus_per_node=gpus_per_node,
        partition=partition,
        requeue=True,
        open_mode_append=True,
        signal_lead_s=lead_s if lead_s is not None else (_lead(limit) if limit is not None else None),
        extra=(*sbatch_extra, *extra),
    )
    script = _write_folder(folder, spec, options, max_requeues)
    try:
        job_id = sbatch(script)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)  # refused: no folder of a run that was never queued
        raise
    record = SlurmRecord(job_id, folder.name, spec.name, spec.kind, time.time(), max_requeues)
    record.write(folder)
    if as_json:
        print_json({"run_id": folder.name, "run_dir": str(folder), "job_id": job_id, "script": str(script)})
        return
    click.echo(
        f"{folder.name}  {spec.name}  Slurm job {job_id} — script {script}; follow it with: "
        f"gpuwarden logs --runs {folder.parent} -f {folder.name}"
    )


def _split(words: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the spec or command, the sbatch options given after a spec)."""
    if words[0].endswith((".yaml", ".yml")) and len(words) > 1:
        return words[:1], words[1:]
    return words, ()


def _one_node(options: tuple[str, ...]) -> None:
    """The job's nodes are the run's (`--nodes`, its resources.nodes): an sbatch option giving
    others would hold nodes no exec runs on, or split the ranks wrongly."""
    for option in options:
        if option in ("-N", "--nodes") or option.startswith(("--nodes=", "-N")):
            raise UserError(
                f"sbatch option {option}: the job's nodes are the run's — give gpuwarden's own "
                "--nodes N (it sets resources.nodes and starts one gpuwarden exec per node)"
            )


def _lead(limit: timedelta) -> int:
    """The default warning before the time limit, shortened for a short job: it must leave the
    job more than Slurm's 30-s check (SbatchOptions refuses less)."""
    return max(1, min(DEFAULT_LEAD_S, int(limit.total_seconds() / 2)))


def _write_folder(folder: Path, spec: RunSpec, options: SbatchOptions, max_requeues: int) -> Path:
    """The run's folder with the spec the job runs and its batch script; the script's path."""
    make_dirs(folder)
    spec_path = folder / SPEC_NAME
    written = spec.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    document = {"version": 1, "name": spec.name, "kind": spec.kind, **written}
    spec_path.write_text(
        "# The spec this run's Slurm job runs, as submitted (its paths made absolute).\n"
        + yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
    )
    command = [sys.executable, "-m", "gpuwarden", "exec", str(spec_path), "--run", str(folder)]
    command += ["--slurm-requeue", str(max_requeues)]
    if spec.resources.nodes > 1:  # each node's exec learns its rank from SLURM_NODEID
        command += ["--nodes", str(spec.resources.nodes)]
    script = folder / SCRIPT_NAME
    script.write_text(sbatch_script(options, command))
    return script


@slurm.command("cancel")
@click.argument("run")
@runs_option
def cancel(run: str, runs_dir: Path | None) -> None:
    """Cancel the Slurm job of a run submitted with `gpuwarden slurm submit`."""
    from gpuwarden.slurm.scheduler import cancel as scancel

    root = runs_dir or DEFAULT_RUNS
    found = records(root)
    matches = [
        run_id for run_id, (_, record) in found.items() if run_id.startswith(run) or record.name == run
    ]
    if not matches:
        raise UserError(
            f"no run submitted to Slurm matches '{run}' in {root} — see `gpuwarden ps --runs {root}`"
        )
    if len(matches) > 1:
        raise UserError(
            f"'{run}' matches several runs in {root}: {', '.join(matches[:5])} — give more of the id"
        )
    _, record = found[matches[0]]
    scancel(record.job_id)
    click.echo(f"{record.run_id}  Slurm job {record.job_id} cancelled")


def parse_time(text: str) -> timedelta:
    """A Slurm time limit: MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS,
    DAYS-HOURS:MINUTES or DAYS-HOURS:MINUTES:SECONDS (sbatch's forms)."""
    wrong = UserError(f"--time {text!r}: not a time limit — write MINUTES, HH:MM:SS or D-HH:MM:SS")
    days_part, _, rest = text.strip().rpartition("-")
    try:
        days = int(days_part) if days_part else 0
        parts = [int(p) for p in rest.split(":")]
    except ValueError:
        raise wrong from None
    if not parts or len(parts) > 3 or any(p < 0 for p in [days, *parts]):
        raise wrong
    if days_part:
        hours, minutes, seconds = [*parts, 0, 0][:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:
        hours, (minutes, seconds) = 0, [*parts, 0][:2]
    limit = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    if limit <= timedelta(0):
        raise wrong
    return limit
