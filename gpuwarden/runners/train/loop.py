"""The training loop: micro-batches, accumulation, mixed precision, checkpoints, OOM and SIGTERM.

Correct by default (the slow-training checklist): autocast where the precision asks for it, GradScaler for
fp16 only, fused AdamW where available, TF32/cuDNN switches applied, `torch.compile` when asked,
and no host–device synchronisation except on log steps (the loss is accumulated as a tensor).

Consistency rules that make resumes exact:
- A checkpoint always describes the state at an optimizer-step boundary: model, optimizer,
  scheduler, GradScaler, every RNG as it was when the next step began, and the data position in
  samples.
- An OOM or a stop request in the middle of a step abandons the step: gradients are dropped, the
  partial loss discarded, and the checkpoint uses the RNG state captured when the step began, so
  the next attempt redoes the whole step from its first sample. An OOM inside `optimizer.step()`
  may leave a half-applied update, so it gets no checkpoint (the previous one stays valid).

Several processes (torchrun, `gang.py`): the model is wrapped in DDP and each rank trains on its
block of every step's samples (`sampling.rank_positions`), dividing its summed loss by the loss
units of the whole gang's step, so the averaged gradient is one process's over the same samples.
Accumulation micro-batches skip the gradient all-reduce (`no_sync`); the last one does it. Ranks
stop together at a step boundary (they agree on SIGTERM every step), rank 0 writes checkpoints
with every rank's RNG state, and every rank reports its own memory. A rank that runs out of
memory writes its `oom` event and exits without a checkpoint: the others may be waiting in a
collective, so the gang resumes from the last complete one. A rank whose peer failed writes an
`error` (gang_aborted) and exits with EXIT_GANG_ABORTED.
"""

from __future__ import annotations

import gc
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader

from gpuwarden.core.config.spec_train import OptimizerSpec, SchedulerSpec, TrainSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.events import (
    EXIT_OK,
    EXIT_OOM,
    EXIT_TERMINATED,
    Checkpoint,
    Finished,
    FixedMemory,
    Oom,
    Progress,
    Started,
    Warning,
)
from gpuwarden.runners.checkpoint import (
    CheckpointPayload,
    RngState,
    find_latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from gpuwarden.runners.device import (
    PrecisionChoice,
    device_name,
    fused_adamw_supported,
    memory_stats,
    synchronize,
)
from gpuwarden.runners.events import EventWriter
from gpuwarden.runners.gang import Gang, is_peer_failure, report_peer_lost
from gpuwarden.runners.pause_hook import pause_step, wait_for_stop
from gpuwarden.runners.report import build_report, write_report
from gpuwarden.runners.stop import StopRequest
from gpuwarden.runners.train.sampling import PositionSampler, mix_seed
from gpuwarden.runners.train.stall_hook import stall_forever, stall_step
from gpuwarden.runners.train.task import Batch, PreparedTask
from gpuwarden.sdk.fixed_memory import measure as measure_fixed_memory

OOM_EXCEPTIONS = (RuntimeError, MemoryError)


def total_steps_for(spec: TrainSpec, num_samples: int) -> int:
    """Optimizer steps of the whole run: `max_steps`, else `epochs` over the data (at least 1)."""
    if spec.max_steps is not None:
        return spec.max_steps
    return max(1, math.ceil(spec.epochs * num_samples / spec.effective_batch))


def lr_lambda(sched: SchedulerSpec, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the base learning rate after `step` optimizer steps: linear warm-up to 1,
    then cosine or linear decay to `min_lr_ratio` at `total_steps`, or constant."""
    warmup = sched.warmup_steps

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if sched.schedule == "constant":
            return 1.0
        span = max(1, total_steps - warmup)
        progress = min(1.0, (step - warmup) / span)
        shape = 1.0 - progress if sched.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return sched.min_lr_ratio + (1.0 - sched.min_lr_ratio) * shape

    return factor


def build_optimizer(
    model: nn.Module, opt: OptimizerSpec, device: torch.device
) -> tuple[torch.optim.AdamW, str, str | None]:
    """AdamW with weight decay on matrices only (not on biases and norms).

    Returns the optimizer, the implementation used ("fused"/"foreach") and a warning when
    `fused: true` was asked for and could not be had.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups: list[dict[str, Any]] = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": opt.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    kwargs: dict[str, Any] = {"lr": opt.lr, "betas": opt.betas, "eps": opt.eps}
    want_fused = opt.fused is True or (opt.fused == "auto" and fused_adamw_supported(device))
    if want_fused:
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs), "fused", None
        except (RuntimeError, ValueError) as exc:
            warning = (
                None if opt.fused == "auto" else f"fused AdamW is unavailable here ({exc}); using foreach"
            )
            return torch.optim.AdamW(groups, foreach=True, **kwargs), "foreach", warning
    return torch.optim.AdamW(groups, foreach=True, **kwargs), "foreach", None


def resolve_loader_settings(spec: TrainSpec, device: torch.device) -> tuple[int, bool]:
    """(num_workers, pin_memory) after resolving "auto"."""
    if spec.num_workers == "auto":
        if device.type == "cuda":
            cores = len(os.sched_getaffinity(0))
            workers = max(0, min(4, cores - 1))
        else:
            # On the CPU the workers would compete with the compute threads for the same cores,
            # and the datasets trained there are small enough to load in the main process.
            workers = 0
    else:
        workers = spec.num_workers
    pin = (
        device.type == "cuda"
        if spec.pin_memory == "auto"
        else bool(spec.pin_memory and device.type == "cuda")
    )
    return workers, pin


def _seed_worker(worker_id: int) -> None:
    """Seed python/numpy in a DataLoader worker from its torch seed (derived from the run's seed)."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class RunState:
    """Counters of the whole run; they travel in checkpoint metadata across attempts."""

    step: int = 0
    samples_seen: int = 0
    tokens_seen: int = 0
    loss_first: float | None = None
    loss_last: float | None = None


@dataclass
class _Counts:
    """Where this attempt began (step, samples, tokens), for the report's per-attempt figures."""

    step: int
    samples: int
    tokens: int


@dataclass
class _Window:
    """One log window: the loss summed on the device (read once per window, not per step) and
    where the window began."""

    loss: torch.Tensor
    steps: int
    started: float
    samples: int
    tokens: int


class _StepAborted(Exception):
    """A stop request arrived between micro-batches (or the gang agreed to stop): the step is
    abandoned and redone later."""


class Trainer:
    """One attempt of a training run: setup, resume, the loop, and the exits it can take."""

    def __init__(
        self,
        spec: TrainSpec,
        task: PreparedTask,
        *,
        run_dir: Path,
        attempt: int,
        events: EventWriter,
        device: torch.device,
        precision: PrecisionChoice,
        stop: StopRequest,
        gang: Gang | None = None,
    ) -> None:
        self.spec = spec
        self.gang = gang or Gang()
        self.task = task
        self.run_dir = run_dir
        self.attempt = attempt
        self.events = events
        self.device = device
        self.precision = precision
        self.stop = stop
        self.ckpt_root = run_dir / "checkpoints"
        self.total_steps = total_steps_for(spec, task.num_samples)
        self.state = RunState()
        self.phase = "setup"

        self.model = task.model
        if spec.gradient_checkpointing:
            task.enable_gradient_checkpointing()
        self.channels_last = spec.channels_last and task.image_like
        self.model.to(device)
        if self.channels_last:
            self.model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.model.train()
        self.optimizer, self.optimizer_impl, fused_warning = build_optimizer(
            self.model, spec.optimizer, device
        )
        if fused_warning:
            self.warn("fused_adamw_unavailable", fused_warning, requested="fused", used="foreach")
        self.scheduler = LambdaLR(self.optimizer, lr_lambda(spec.scheduler, self.total_steps))
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision.needs_grad_scaler)
        # DDP (several ranks) or the model itself; checkpoints always hold the bare model's state
        self.ddp = self.gang.wrap(self.model)
        self.forward_model: nn.Module = self.ddp
        if spec.compile:
            compiled: Callable[..., Any] = torch.compile(self.ddp, mode=spec.compile_mode)
            self.forward_model = compiled  # type: ignore[assignment]
        self.num_workers, self.pin_memory = resolve_loader_settings(spec, device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self._resume_rng: RngState | None = None
        # rank 0 keeps the run's seed (a one-process run's streams); other ranks draw their own
        rank = self.gang.rank
        self._seed = spec.seed if rank == 0 else mix_seed(spec.seed, rank)
        self._stall_at = stall_step(rank)
        self._pause_at = pause_step(rank)

    # events -----------------------------------------------------------------------------------

    def warn(self, code: str, message: str, *, requested: Any = None, used: Any = None) -> None:
        if self.gang.is_main:  # every rank would say the same
            self.events.emit(Warning(code=code, message=message, requested=requested, used=used))

    # checkpoints ------------------------------------------------------------------------------

    def resume(self) -> Path | None:
        """Load the newest complete checkpoint of the run, if any; returns its path."""
        path = find_latest_checkpoint(self.ckpt_root)
        if path is None:
            return None
        ckpt = load_checkpoint(path, map_location=self.device, rank=self.gang.rank)
        self.model.load_state_dict(ckpt.model)
        self.optimizer.load_state_dict(ckpt.optimizer)
        self.scheduler.load_state_dict(ckpt.scheduler)
        if ckpt.scaler is not None and self.scaler.is_enabled():
            self.scaler.load_state_dict(ckpt.scaler)
        meta = ckpt.meta
        self.state = RunState(
            step=ckpt.step,
            samples_seen=ckpt.samples_seen,
            tokens_seen=int(meta.get("tokens_seen", 0)),
            loss_first=meta.get("loss_first"),
            loss_last=meta.get("loss_last"),
        )
        self._resume_rng = ckpt.rng
        if ckpt.rng is None:
            # written by fewer processes: this rank's streams go on from a seed of its own
            self._seed = mix_seed(self.spec.seed, self.gang.rank, ckpt.samples_seen)
        old_batch = meta.get("effective_batch")
        if old_batch is not None and old_batch != self.spec.effective_batch:
            self.warn(
                "effective_batch_changed",
                f"the checkpoint was written with effective batch {old_batch}, this attempt uses "
                f"{self.spec.effective_batch}: the optimisation differs from an uninterrupted run",
                requested=old_batch,
                used=self.spec.effective_batch,
            )
        if meta.get("num_samples") not in (None, self.task.num_samples):
            self.warn(
                "data_changed",
                f"the data had {meta['num_samples']} samples when the checkpoint was written, now "
                f"{self.task.num_samples}: the data order after the resume differs",
            )
        return path

    def save(self, reason: str, rng: RngState) -> Path | None:
        """Checkpoint the current (boundary) state with every rank's `rng` and emit a `checkpoint`
        event. Every rank calls it at the same step; rank 0 writes (the others get None)."""
        rngs = self.gang.gather(rng)
        if not self.gang.is_main:
            return None
        scaler_state = self.scaler.state_dict() if self.scaler.is_enabled() else None
        payload = CheckpointPayload(
            step=self.state.step,
            samples_seen=self.state.samples_seen,
            model=self.model.state_dict(),
            optimizer=self.optimizer.state_dict(),
            scheduler=self.scheduler.state_dict(),
            scaler=scaler_state,
            rng=rng,
            rank_rngs=rngs[1:],
            meta={
                "tokens_seen": self.state.tokens_seen,
                "loss_first": self.state.loss_first,
                "loss_last": self.state.loss_last,
                "batch_size": self.spec.batch_size,
                "grad_accum_steps": self.spec.grad_accum_steps,
                "effective_batch": self.spec.effective_batch,
                "world_size": self.gang.world_size,
                "num_samples": self.task.num_samples,
                "total_steps": self.total_steps,
                "seed": self.spec.seed,
                "task": self.task.name,
                "attempt": self.attempt,
            },
        )
        path = save_checkpoint(self.ckpt_root, payload, keep=self.spec.keep_checkpoints, reason=reason)
        self.events.emit(
            Checkpoint(
                path=str(path), step=self.state.step, samples_seen=self.state.samples_seen, reason=reason
            )
        )
        return path

    # data -------------------------------------------------------------------------------------

    def make_loader(self) -> Iterator[Batch]:
        """Micro-batches from the current sample position to the end of the run."""
        # counted from the current position, so a resume with another effective batch still
        # gets exactly the samples its remaining steps need
        stop = self.state.samples_seen + (self.total_steps - self.state.step) * self.spec.effective_batch
        sampler = PositionSampler(
            self.task.num_samples,
            self.spec.seed,
            self.state.samples_seen,
            stop,
            rank=self.gang.rank,
            world_size=self.gang.world_size,
            per_rank=self.spec.batch_size * self.spec.grad_accum_steps,
        )
        workers = self.num_workers
        loader: DataLoader[Any] = DataLoader(
            self.task.dataset,
            batch_size=self.spec.batch_size,
            sampler=sampler,
            collate_fn=self.task.collate,
            num_workers=workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.spec.persistent_workers and workers > 0,
            prefetch_factor=self.spec.prefetch_factor if workers > 0 else None,
            worker_init_fn=_seed_worker if workers > 0 else None,
            # a private generator: creating the iterator must not draw from the global RNG,
            # or a resumed attempt would see a different dropout stream than an uninterrupted one
            generator=torch.Generator().manual_seed(mix_seed(self.spec.seed, self.state.samples_seen)),
        )
        return iter(loader)

    # the loop ---------------------------------------------------------------------------------

    def _autocast(self) -> torch.autocast:
        return torch.autocast(
            device_type=self.device.type, dtype=self.precision.dtype, enabled=self.precision.autocast
        )

    def _one_step(self, batches: Iterator[Batch]) -> tuple[torch.Tensor, int, int]:
        """Run one optimizer step; returns (this rank's part of the step loss as a device tensor,
        the gang's samples, the gang's tokens)."""
        self.phase = "data"
        micro: list[Batch] = [next(batches) for _ in range(self.spec.grad_accum_steps)]
        if self._pause_at == self.state.step:
            wait_for_stop(self.stop)
        # counted on the host (no device sync); one small exchange gives the gang's totals and
        # tells whether any rank was asked to stop
        self.phase = "exchange"
        units, samples, tokens, stops = self.gang.sum_counts(
            [
                sum(b.units for b in micro),
                sum(b.size for b in micro),
                sum(b.tokens for b in micro),
                int(self.stop.requested),
            ]
        )
        if stops:
            raise _StepAborted
        units = max(1, units)
        # DDP averages the ranks' gradients: scaling by the world size turns that into their sum
        world = self.gang.world_size
        step_loss = torch.zeros((), device=self.device, dtype=torch.float32)
        for i, batch in enumerate(micro):
            if i > 0 and self.stop.requested and not self.gang.distributed:
                raise _StepAborted
            tensors = batch.to(self.device, channels_last=self.channels_last)
            with self.gang.no_sync(self.ddp, sync=i == len(micro) - 1):
                self.phase = "forward"
                with self._autocast():
                    loss = self.task.loss_sum(self.forward_model, tensors) / units
                self.phase = "backward"
                scaled = loss * world if world > 1 else loss
                self.scaler.scale(scaled).backward()  # type: ignore[no-untyped-call]
            step_loss += loss.detach().float()
            del tensors, loss, scaled
        micro.clear()
        self.phase = "clip"
        if self.spec.grad_clip is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.params, self.spec.grad_clip, foreach=True)
        self.phase = "optimizer"
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return step_loss, samples, tokens

    def run(self) -> int:
        """Resume if possible, train to the end (or a stop/OOM), and return the exit status."""
        try:
            return self._run()
        except RuntimeError as exc:
            if self.gang.distributed and is_peer_failure(exc):
                where = f"at step {self.state.step} ({self.phase})"
                return report_peer_lost(self.events, self.gang.rank, exc, where)
            raise

    def _started(self, resumed: Path | None) -> Started:
        return Started(
            task=self.task.name,
            config={
                **self.spec.model_dump(mode="json"),
                "resolved": {
                    "total_steps": self.total_steps,
                    "num_workers": self.num_workers,
                    "pin_memory": self.pin_memory,
                    "optimizer": self.optimizer_impl,
                    "channels_last": self.channels_last,
                    "effective_batch": self.spec.effective_batch,
                    **self.task.summary,
                },
            },
            device=device_name(self.device),
            dtype=self.precision.used,
            parameters=sum(p.numel() for p in self.model.parameters()),
            resumed_from=str(resumed) if resumed else None,
            samples_seen=self.state.samples_seen,
            tokens_seen=self.state.tokens_seen,
            pid=os.getpid(),
            world_size=self.gang.world_size if self.gang.distributed else None,
        )

    def _report_fixed_memory(self) -> None:
        """Weights held, gradients and optimizer state to come: when these alone exceed the
        memory, the daemon tries no smaller micro-batch."""
        fixed = measure_fixed_memory(self.model, [self.optimizer])
        if fixed is not None:
            self.events.emit(FixedMemory(**fixed.event_fields()))

    def _run(self) -> int:
        resumed = self.resume()
        self.events.emit(self._started(resumed))
        self._report_fixed_memory()
        batches = self.make_loader()
        if self._resume_rng is not None:
            self._resume_rng.restore()
        else:
            _seed_everything(self._seed)

        total_samples = (
            self.state.samples_seen + (self.total_steps - self.state.step) * self.spec.effective_batch
        )
        begun = _Counts(self.state.step, self.state.samples_seen, self.state.tokens_seen)
        t_start = time.perf_counter()
        window = self._new_window(t_start)
        last_saved_step = self.state.step if resumed else -1

        while self.state.step < self.total_steps:
            if self._stall_at == self.state.step and (resumed is None or self.state.step > begun.step):
                stall_forever()
            boundary = RngState.capture()
            # ranks of a gang decide to stop together, inside the step's exchange
            if self.stop.requested and not self.gang.distributed:
                return self._terminate(boundary)
            stepped = self._step(batches, boundary)
            if isinstance(stepped, int):  # stopped or out of memory: the attempt's exit status
                return stepped
            step_loss, samples, tokens = stepped

            self.state.step += 1
            self.state.samples_seen += samples
            self.state.tokens_seen += tokens
            window.loss += step_loss
            window.steps += 1
            last = self.state.step == self.total_steps
            if self.state.step % self.spec.log_interval == 0 or last or self.state.step == begun.step + 1:
                window = self._log_window(window, total_samples)
            if self.state.step % self.spec.checkpoint_interval == 0 and not last:
                self.phase = "checkpoint"
                self.save("interval", RngState.capture())
                last_saved_step = self.state.step

        synchronize(self.device)
        wall = time.perf_counter() - t_start
        self.phase = "final"
        if last_saved_step != self.state.step:
            self.save("final", RngState.capture())
        if not self.gang.is_main:
            return EXIT_OK
        self._finish(begun, wall)
        return EXIT_OK

    def _step(self, batches: Iterator[Batch], boundary: RngState) -> tuple[torch.Tensor, int, int] | int:
        """One optimizer step's (loss, samples, tokens), or the exit status when it was stopped
        or ran out of memory."""
        oom: tuple[Any, str] | None = None
        try:
            return self._one_step(batches)
        except _StepAborted:
            return self._terminate(boundary)
        except UserError as exc:
            raise _clean_user_error(exc) from None
        except OOM_EXCEPTIONS as exc:
            oom = (_classify(exc), self.phase)
            if not oom[0].is_oom:
                raise
        # Handled once the except block has let go of the exception: its traceback holds the
        # step's tensors, which the OOM exit frees before it checkpoints.
        return self._on_oom(oom[0], oom[1], boundary)

    def _new_window(self, now: float) -> _Window:
        return _Window(
            loss=torch.zeros((), device=self.device, dtype=torch.float32),
            steps=0,
            started=now,
            samples=self.state.samples_seen,
            tokens=self.state.tokens_seen,
        )

    def _log_window(self, window: _Window, total_samples: int) -> _Window:
        """Emit the window's `progress` event; the next window starts now."""
        self.phase = "log"
        # the one sync per window (and, in a gang, the losses of every rank summed)
        loss_value = float(self.gang.sum(window.loss).item()) / window.steps
        synchronize(self.device)
        now = time.perf_counter()
        elapsed = max(now - window.started, 1e-9)
        if self.state.loss_first is None:
            self.state.loss_first = loss_value
        self.state.loss_last = loss_value
        if not math.isfinite(loss_value):
            self.warn("loss_not_finite", f"the loss is {loss_value} at step {self.state.step}")
        new_tokens = self.state.tokens_seen - window.tokens
        self.events.emit(
            Progress(
                step=self.state.step,
                samples_seen=self.state.samples_seen,
                tokens_seen=self.state.tokens_seen or None,
                loss=loss_value if math.isfinite(loss_value) else None,
                lr=float(self.scheduler.get_last_lr()[0]),
                samples_per_s=(self.state.samples_seen - window.samples) / elapsed,
                tokens_per_s=new_tokens / elapsed if new_tokens else None,
                batch_size=self.spec.batch_size,
                total=total_samples,
                **memory_stats(self.device).as_progress(),
            )
        )
        window.loss.zero_()  # reused: no new device allocation per window
        window.steps = 0
        window.started, window.samples, window.tokens = now, self.state.samples_seen, self.state.tokens_seen
        return window

    def _finish(self, begun: _Counts, wall: float) -> None:
        """Export the model and write the report (main rank only)."""
        outputs = self.run_dir / "outputs" / "model"
        if self.task.export is not None:
            self.task.export(self.model, outputs)
        report = build_report(
            task=self.task.name,
            steps=self.state.step,
            samples_seen=self.state.samples_seen,
            tokens_seen=self.state.tokens_seen or None,
            attempt=self.attempt,
            attempt_steps=self.state.step - begun.step,
            attempt_samples=self.state.samples_seen - begun.samples,
            attempt_tokens=self.state.tokens_seen - begun.tokens,
            wall_s=wall,
            mem_peak=memory_stats(self.device).peak,
            loss_first=self.state.loss_first,
            loss_last=self.state.loss_last,
            device=device_name(self.device),
            dtype=self.precision.used,
            batch_size=self.spec.batch_size,
            grad_accum_steps=self.spec.grad_accum_steps,
            world_size=self.gang.world_size,
            extra={"outputs": str(outputs) if self.task.export is not None else None, **self.task.summary},
        )
        write_report(self.run_dir, report)
        self.events.emit(Finished(report=report))

    # exits ------------------------------------------------------------------------------------

    def _drop_step(self) -> None:
        """Forget a half-done step: gradients, cached blocks (so a checkpoint can be written)."""
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _terminate(self, boundary: RngState) -> int:
        """SIGTERM: checkpoint the last completed step (reason "sigterm") and exit 143."""
        self._drop_step()
        self.phase = "checkpoint"
        self.save("sigterm", boundary)
        return EXIT_TERMINATED

    def _on_oom(self, verdict: Any, phase: str, boundary: RngState) -> int:
        """Out of memory: checkpoint when the state is consistent, emit `oom`, exit EXIT_OOM.

        A rank of a gang never checkpoints here: a checkpoint needs every rank, and the others
        may be waiting in a collective for this one. The last complete checkpoint stays valid.
        """
        self._drop_step()
        path: Path | None = None
        if phase not in ("optimizer", "checkpoint") and not self.gang.distributed:
            try:
                path = self.save("oom", boundary)
            except (RuntimeError, MemoryError, OSError) as exc:
                # memory may still be too tight to serialise; the previous checkpoint stays valid
                print(
                    f"gpuwarden: could not write a checkpoint after the OOM: {exc}",
                    file=sys.stderr,
                    flush=True,
                )
        self.events.emit(
            Oom(
                verdict=verdict.verdict,
                message=verdict.message,
                fields=verdict.fields,
                phase=phase,
                batch_size=self.spec.batch_size,
                step=self.state.step,
                checkpoint=str(path) if path else None,
            )
        )
        who = f"rank {self.gang.rank}: " if self.gang.distributed else ""
        print(
            f"gpuwarden: {who}out of memory ({verdict.verdict}) in {phase}: {verdict.message}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_OOM


def _classify(exc: BaseException) -> Any:
    from gpuwarden.core.oom.classify import classify_exception

    return classify_exception(exc)


def _clean_user_error(exc: UserError) -> UserError:
    """A UserError raised in a DataLoader worker arrives wrapped in a traceback text; keep its
    last line (the original message)."""
    lines = [line.strip() for line in exc.message.splitlines() if line.strip()]
    message = lines[-1] if lines else exc.message
    prefix = "gpuwarden.core.errors.UserError: "
    if message.startswith(prefix):
        message = message[len(prefix) :]
    return UserError(message, code="bad_data" if exc.code == "bad_input" else exc.code)
