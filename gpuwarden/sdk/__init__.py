"""gpuwarden for your own training script: progress, checkpoints and an OOM guard.

    from gpuwarden import sdk

    start = sdk.resume_from()                  # None on a first attempt, else a checkpoint path
    sdk.fixed_memory(model, optimizer)         # once both are built: weights, gradients, state
    with sdk.oom_guard(save=save_checkpoint) as guard:
        for step in ...:
            ...
            guard.step, guard.samples_seen = step, samples
            sdk.progress(step, samples, loss=loss, batch_size=micro_batch)
            sdk.checkpoint(path, step, samples)

Outside gpuwarden every call does nothing and the guard lets exceptions through unchanged. The
SDK imports only the standard library (and gpuwarden's classifier when an exception needs it);
it never imports torch or the daemon. Hugging Face Trainer and Lightning have callbacks in
`gpuwarden.sdk.transformers` and `gpuwarden.sdk.lightning`.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.sdk.guard import EXIT_OOM, OomGuard, oom_guard, report_oom
from gpuwarden.sdk.reporter import Reporter, default_reporter, memory, resume_from


def active() -> bool:
    """Whether this process runs as an attempt of a gpuwarden run."""
    return default_reporter().active


def progress(step: int, samples_seen: int, **fields: Any) -> None:
    """Report optimizer steps done and samples seen (loss, batch_size, lr, tokens_seen,
    samples_per_s, tokens_per_s, total)."""
    default_reporter().progress(step, samples_seen, **fields)


def checkpoint(path: str, step: int, samples_seen: int) -> None:
    """Report a complete checkpoint (after it is fully written)."""
    default_reporter().checkpoint(path, step, samples_seen)


def fixed_memory(model: Any, *optimizers: Any) -> None:
    """Report what the model holds whatever the micro-batch, once the model and its optimizer
    are built (and a checkpoint loaded): when that alone exceeds the memory, the daemon does not
    try smaller micro-batches."""
    default_reporter().fixed_memory(model, optimizers)


def finished(**report: Any) -> None:
    """Report the end of training, with whatever figures the script wants kept."""
    default_reporter().finished(**report)


__all__ = [
    "EXIT_OOM",
    "OomGuard",
    "Reporter",
    "active",
    "checkpoint",
    "finished",
    "fixed_memory",
    "memory",
    "oom_guard",
    "progress",
    "report_oom",
    "resume_from",
]
