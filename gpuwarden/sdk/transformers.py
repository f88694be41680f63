"""gpuwarden's TrainerCallback for Hugging Face Trainer scripts.

    trainer = Trainer(..., callbacks=[GpuwardenCallback()])

Progress with memory at every logging step, a `checkpoint` event after every save, and an
out-of-memory turned into a checkpoint of the last completed step + an `oom` event + exit 3.
A callback cannot catch the Trainer's exceptions, so the OOM is handled where the exception
ends the script (a chained `sys.excepthook`); the Trainer is found in the exception's frames
unless it is given. Outside gpuwarden the callback does nothing.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Any

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from gpuwarden.sdk.guard import EXIT_OOM, report_oom
from gpuwarden.sdk.reporter import Reporter, default_reporter

# An OOM raised inside the optimizer's update leaves weights and optimizer state out of step.
_OPTIMIZER_FRAMES = (f"torch{os.sep}optim{os.sep}",)


def _frames(tb: TracebackType | None) -> list[Any]:
    out = []
    while tb is not None:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return out


class GpuwardenCallback(TrainerCallback):
    def __init__(self, trainer: Trainer | None = None, reporter: Reporter | None = None) -> None:
        self.trainer = trainer
        self.reporter = reporter or default_reporter()
        self._effective = 1
        self._micro: int | None = None
        self._previous_hook = sys.excepthook

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._micro = int(args.per_device_train_batch_size)
        self._effective = self._micro * int(args.gradient_accumulation_steps) * max(1, int(args.world_size))
        model, optimizer = kwargs.get("model"), kwargs.get("optimizer")
        if model is not None:  # built, with the checkpoint loaded, by the time the loop begins
            self.reporter.fixed_memory(model, [optimizer] if optimizer is not None else [])
        if self.reporter.active and sys.excepthook is not self._excepthook:
            self._previous_hook = sys.excepthook
            sys.excepthook = self._excepthook

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        logs = logs or {}
        if "loss" not in logs:
            return
        self.reporter.progress(
            state.global_step,
            state.global_step * self._effective,
            loss=float(logs["loss"]),
            lr=float(logs["learning_rate"]) if "learning_rate" in logs else None,
            batch_size=self._micro,
            total=state.max_steps * self._effective if state.max_steps else None,
        )

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        path = os.path.join(str(args.output_dir), f"checkpoint-{state.global_step}")
        if os.path.isdir(path):
            self.reporter.checkpoint(path, state.global_step, state.global_step * self._effective)

    def _excepthook(
        self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        frames = _frames(tb)
        trainer = self.trainer or next(
            (f.f_locals["self"] for f in frames if isinstance(f.f_locals.get("self"), Trainer)), None
        )
        consistent = not any(any(p in f.f_code.co_filename for p in _OPTIMIZER_FRAMES) for f in frames)
        del frames
        self._previous_hook(exc_type, exc, tb)  # the traceback a user expects, on stderr
        step = trainer.state.global_step if trainer is not None else None
        save = (lambda: self._save(trainer)) if trainer is not None else None
        if isinstance(exc, Exception) and report_oom(
            exc,
            reporter=self.reporter,
            save=save,
            consistent=consistent,
            batch_size=self._micro,
            step=step,
            samples_seen=None if step is None else step * self._effective,
        ):
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(EXIT_OOM)  # in an excepthook, SystemExit would only be reported, not obeyed

    def _save(self, trainer: Trainer) -> str:
        """The Trainer's own checkpoint of the last completed step (kept if it exists)."""
        path = os.path.join(str(trainer.args.output_dir), f"checkpoint-{trainer.state.global_step}")
        if not os.path.exists(os.path.join(path, "trainer_state.json")) and trainer.model is not None:
            trainer._save_checkpoint(trainer.model, trial=None)
        return path
