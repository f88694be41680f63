"""Entry point of the training runner: `run(spec, run_dir, attempt, events) -> exit status`."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.events import Warning
from gpuwarden.runners.device import configure_backends, resolve_precision, select_device
from gpuwarden.runners.events import EventWriter
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


def run(spec: RunSpec, run_dir: Path, attempt: int, events: EventWriter) -> int:
    """Train as `spec.train` says, resuming from the run's newest checkpoint; returns the exit code."""
    train = spec.train
    if train is None:
        raise UserError("kind 'train' needs a `train:` section", code="invalid_config")
    if train.world_size > 1:
        raise UserError(
            f"world_size {train.world_size}: multi-GPU training is launched through torchrun, which this "
            "runner does not drive yet — set world_size: 1",
            code="unsupported",
        )
    device = select_device(spec.resources.gpus, spec.resources.allow_cpu)
    requested = train.resolved_precision_request()
    precision = resolve_precision(requested, device)
    if train.amp is True and precision.used == "fp32":
        events.emit(
            Warning(
                code="precision_unavailable",
                message="amp: true asks for mixed precision, which the CPU does not speed up; running fp32",
                requested="amp",
                used="fp32",
            )
        )
    elif precision.warning:
        events.emit(
            Warning(
                code="precision_unavailable" if precision.used != requested else "precision_slow",
                message=precision.warning,
                requested=requested,
                used=precision.used,
            )
        )
    configure_backends(device, tf32=train.tf32, cudnn_benchmark=train.cudnn_benchmark)
    task = prepare_task(spec)
    trainer = Trainer(
        train,
        task,
        run_dir=run_dir,
        attempt=attempt,
        events=events,
        device=device,
        precision=precision,
        stop=STOP,
    )
    return trainer.run()
