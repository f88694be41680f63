"""What a training task gives the loop: a model, a dataset keyed by sample, and a summed loss.

Losses are *sums* over loss units (label tokens for language models, samples for images); the
loop divides by the units of the whole optimizer step. Accumulating micro-batches therefore gives
the same gradient as one full batch, whatever the split, up to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.data import Dataset


@dataclass
class Batch:
    """One micro-batch: tensors plus host-side counts (known without a device sync)."""

    tensors: dict[str, torch.Tensor]
    size: int  # samples
    units: int  # loss units: label tokens (causal_lm) or samples (image)
    tokens: int = 0  # input tokens processed, 0 where it does not apply

    def pin_memory(self) -> Batch:
        """Called by DataLoader(pin_memory=True): page-locked copies for async host→device copies."""
        return Batch({k: v.pin_memory() for k, v in self.tensors.items()}, self.size, self.units, self.tokens)

    def to(self, device: torch.device, *, channels_last: bool = False) -> dict[str, torch.Tensor]:
        """The tensors on `device` (non-blocking; 4-D image tensors optionally channels_last)."""
        out: dict[str, torch.Tensor] = {}
        for name, value in self.tensors.items():
            moved = value.to(device, non_blocking=True)
            if channels_last and moved.dim() == 4:
                moved = moved.contiguous(memory_format=torch.channels_last)
            out[name] = moved
        return out


@dataclass
class PreparedTask:
    """A task ready to train: built model (fp32, on the CPU), data and loss."""

    name: str
    model: nn.Module
    dataset: Dataset[Any]
    num_samples: int  # items per epoch
    collate: Callable[[list[Any]], Batch]
    loss_sum: LossFn
    image_like: bool  # channels_last and per-block checkpointing apply
    enable_gradient_checkpointing: Callable[[], None]
    export: Callable[[nn.Module, Path], None] | None = None  # writes the final model into a dir
    summary: dict[str, Any] = field(default_factory=dict)


class LossFn(Protocol):
    def __call__(self, model: nn.Module, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """Sum of the loss over the micro-batch's loss units (a 0-d tensor, on the device)."""
        ...
