"""gpuwarden's Lightning callback (`pip install gpuwarden[lightning]`).

    trainer = L.Trainer(..., callbacks=[GpuwardenCallback()])
    trainer.fit(model, ckpt_path=sdk.resume_from())      # or the --ckpt_path the preset passes

Progress with memory after every optimizer step, a `checkpoint` event for every checkpoint file
the Trainer wrote, and an out-of-memory turned into a checkpoint (unless the last completed step
has one already) + an `oom` event + exit 3, from Lightning's own `on_exception` hook. Outside
gpuwarden the callback does nothing.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import lightning.pytorch as pl

from gpuwarden.sdk.guard import EXIT_OOM, report_oom
from gpuwarden.sdk.reporter import Reporter, default_reporter


class GpuwardenCallback(pl.Callback):
    def __init__(self, reporter: Reporter | None = None) -> None:
        self.reporter = reporter or default_reporter()
        self._last_step = -1
        self._reported: set[str] = set()
        self._micro: int | None = None

    def _effective(self, trainer: pl.Trainer) -> int:
        return (self._micro or 1) * int(trainer.accumulate_grad_batches) * max(1, int(trainer.world_size))

    def _report_checkpoints(self, trainer: pl.Trainer) -> str | None:
        """Checkpoint files the Trainer's ModelCheckpoint wrote since the last look; the newest."""
        newest = None
        for cb in trainer.checkpoint_callbacks:
            path = getattr(cb, "last_model_path", "") or getattr(cb, "best_model_path", "")
            for candidate in {path, *getattr(cb, "best_k_models", {})}:
                if candidate and candidate not in self._reported and os.path.exists(candidate):
                    self._reported.add(candidate)
                    step = trainer.global_step
                    self.reporter.checkpoint(str(candidate), step, step * self._effective(trainer))
            newest = path or newest
        return newest if newest and os.path.exists(newest) else None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_step = trainer.global_step  # a resumed run starts past its checkpoint's step
        if trainer.ckpt_path:  # restored by now: the attempt resumed from it, however it was named
            path = str(trainer.ckpt_path)
            self.reporter.resumed(path if "://" in path else os.path.abspath(path))
        self.reporter.fixed_memory(pl_module, trainer.optimizers)  # both set up, checkpoint restored
        # A resumed ModelCheckpoint remembers the files of the attempt that wrote them (and
        # reported them). Reported again here, before a batch has shown the micro-batch, their
        # samples would be counted with a micro-batch of 1.
        for cb in trainer.checkpoint_callbacks:
            known = (getattr(cb, "last_model_path", ""), getattr(cb, "best_model_path", ""))
            self._reported.update(p for p in (*known, *getattr(cb, "best_k_models", {})) if p)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if isinstance(batch, list | tuple) and batch and hasattr(batch[0], "shape"):
            self._micro = int(batch[0].shape[0])
        if trainer.global_step == self._last_step:
            return  # inside an accumulation window
        self._last_step = trainer.global_step
        loss: Any = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.reporter.progress(
            trainer.global_step,
            trainer.global_step * self._effective(trainer),
            loss=float(loss.detach()) if loss is not None and hasattr(loss, "detach") else None,
            batch_size=self._micro,
        )

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._report_checkpoints(trainer)  # ModelCheckpoint saves after this callback's epoch end

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._report_checkpoints(trainer)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if not self.reporter.active or not isinstance(exception, Exception):
            return
        newest = self._report_checkpoints(trainer)
        step = trainer.global_step
        saved_here = newest is not None and f"step={step}" in os.path.basename(newest)
        folder = os.path.join(str(trainer.default_root_dir), "checkpoints")

        def save() -> str:
            if saved_here and newest is not None:
                return newest
            path = os.path.join(folder, f"gpuwarden-oom-step={step}.ckpt")
            trainer.save_checkpoint(path)
            return path

        traceback.print_exception(exception, file=sys.stderr)  # what a user expects to read
        if report_oom(
            exception,
            reporter=self.reporter,
            save=save,
            batch_size=self._micro,
            step=step,
            samples_seen=step * self._effective(trainer),
        ):
            sys.stderr.flush()
            sys.stdout.flush()
            # Lightning re-raises after this hook and tears down; the process must end with the
            # protocol's status instead, and nothing after an OOM needs the teardown.
            os._exit(EXIT_OOM)
