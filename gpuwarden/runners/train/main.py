"""Entry point of the training runner: `run(spec, run_dir, attempt, events) -> exit status`.

Started by torchrun (RANK/WORLD_SIZE/LOCAL_RANK set), each process is one rank of a data-parallel
gang whose size must be `train.world_size`; started alone, world_size must be 1.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.config.spec_train import TrainSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.events import EXIT_OK, Warning
from gpuwarden.runners.device import (
    PrecisionChoice,
    configure_backends,
    resolve_precision,
    select_device,
)
from gpuwarden.runners.events import EventWriter
from gpuwarden.runners.gang import is_peer_failure, open_gang, rank_device, report_peer_lost
from gpuwarden.runners.rank_env import check_world_size, rank_env
from gpuwarden.runners.stop import STOP
from gpuwarden.runners.train.loop import Trainer
from gpuwarden.runners.train.task import PreparedTask


def prepare_task(spec: RunSpec) -> PreparedTask:
    """Build the model and data for the spec's task (imports the task module lazily)."""
    train = spec.train
    assert train is not None
    if train.task == "causal_lm":
        from gpuwarden.runners.train.causal_lm import prepare_causal_lm

        return prepare_causal_lm(train)
    from gpuwarden.runners.train.image import prepare_image

    return prepare_image(train)


def precision_warning(train: TrainSpec, precision: PrecisionChoice) -> Warning | None:
    """The warning to emit when the precision used is not the one asked for."""
    requested = train.resolved_precision_request()
    if train.amp is True and precision.used == "fp32":
        return Warning(
            code="precision_unavailable",
            message="amp: true asks for mixed precision, which the CPU does not speed up; running fp32",
            requested="amp",
            used="fp32",
        )
    if precision.warning:
        return Warning(
            code="precision_unavailable" if precision.used != requested else "precision_slow",
            message=precision.warning,
            requested=requested,
            used=precision.used,
        )
    return None


def run(
    spec: RunSpec,
    run_dir: Path,
    attempt: int,
    events: EventWriter,
    prepare: Callable[[RunSpec], PreparedTask] = prepare_task,
) -> int:
    """Train as `spec.train` says, resuming from the run's newest checkpoint; returns the exit code.
    `prepare` builds the model and data (a probe session hands out the one it built already)."""
    train = spec.train
    if train is None:
        raise UserError("kind 'train' needs a `train:` section", code="invalid_config")
    ranks = rank_env()
    check_world_size(train.world_size, ranks)
    device = rank_device(select_device(spec.resources.gpus, spec.resources.allow_cpu), ranks)
    requested = train.resolved_precision_request()
    precision = resolve_precision(requested, device)
    warning = precision_warning(train, precision)
    if warning is not None and (ranks is None or ranks.rank == 0):  # rank 0 speaks for every rank
        events.emit(warning)
    configure_backends(device, tf32=train.tf32, cudnn_benchmark=train.cudnn_benchmark)
    # join the gang before the slow model load: every rank is alive at the rendezvous, and a rank
    # that fails later shows up as a failed collective in the others
    gang = open_gang(ranks, device, train.collective_timeout)
    try:
        task = prepare(spec)
        trainer = Trainer(
            train,
            task,
            run_dir=run_dir,
            attempt=attempt,
            events=events,
            device=device,
            precision=precision,
            stop=STOP,
            gang=gang,
        )
        status = trainer.run()
    except RuntimeError as exc:
        if gang.distributed and is_peer_failure(exc):
            return report_peer_lost(events, gang.rank, exc, "setup")
        raise
    if status == EXIT_OK:
        gang.close()  # after a failure a teardown could wait on ranks that are gone
    return status
