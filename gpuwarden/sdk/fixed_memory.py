"""What a training process holds whatever its micro-batch: weights, gradients, optimizer state.

Measured once the model and optimizer are built (and a checkpoint loaded): the memory held now,
plus the gradients and optimizer state that training adds for certain and that do not exist
yet. That sum is a lower bound of the fixed part of the memory line (peak = fixed + per_sample ×
micro-batch): when it alone exceeds the memory that ran out, no micro-batch fits and the daemon
does not try smaller ones.

The bound must never overstate, or a batch that fits would not be tried:
- on CUDA the held part is the caching allocator's allocated bytes, and each tensor to come adds
  at least its own size;
- on the host the held part is the address space (what an address-space limit counts), and only
  tensors of 32 MiB or more are counted as to come: glibc's malloc always maps those afresh,
  while a smaller one may land in address space already reserved and add nothing.

Duck-typed over torch (`parameters()`, `numel()`, `element_size()`, an optimizer's `state` and
`param_groups`): the SDK never imports torch.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuwarden.sdk.proc_status import status_bytes

# glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): an allocation this
# large is always a fresh mapping, so it grows the address space by at least its size.
HOST_FRESH_MAPPING = 32 * 2**20

# State tensors each optimizer keeps per parameter, the size of the parameter each, created at
# its first step. Classes not named give 0: a lower bound stays one.
_STATES_PER_PARAMETER = {
    "Adam": 2,
    "AdamW": 2,
    "Adamax": 2,
    "NAdam": 2,
    "RAdam": 2,
    "Adadelta": 2,
    "Adagrad": 1,
    "SparseAdam": 2,
}


@dataclass(frozen=True)
class FixedMemory:
    """Bytes: held now, gradients and optimizer state still to come, and their sum."""

    device: str  # "cuda" or "cpu": which memory the figures are of
    parameters: int
    held_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int

    @property
    def fixed_bytes(self) -> int:
        return self.held_bytes + self.gradient_bytes + self.optimizer_state_bytes

    def event_fields(self) -> dict[str, Any]:
        return {
            "fixed_bytes": self.fixed_bytes,
            "held_bytes": self.held_bytes,
            "gradient_bytes": self.gradient_bytes,
            "optimizer_state_bytes": self.optimizer_state_bytes,
            "parameters": self.parameters,
            "device": self.device,
        }


def _innermost(optimizer: Any) -> Any:
    """The torch optimizer under Accelerate's or Lightning's wrappers."""
    seen = 0
    while seen < 8:
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None or inner is optimizer:
            return optimizer
        optimizer, seen = inner, seen + 1
    return optimizer


def _states_per_parameter(optimizer: Any, group: dict[str, Any]) -> int:
    name = type(optimizer).__name__
    if name in _STATES_PER_PARAMETER:
        return _STATES_PER_PARAMETER[name] + (1 if name in ("Adam", "AdamW") and group.get("amsgrad") else 0)
    if name == "SGD":
        return 1 if group.get("momentum") else 0
    if name == "RMSprop":
        return 1 + (1 if group.get("momentum") else 0) + (1 if group.get("centered") else 0)
    return 0


def _bytes(tensor: Any) -> int:
    return int(tensor.numel()) * int(tensor.element_size())


def _counted(size: int, device: str) -> int:
    """What a tensor to come of `size` bytes surely adds to the memory measured."""
    return size if device == "cuda" or size >= HOST_FRESH_MAPPING else 0


def _optimizer_state_to_come(optimizers: Iterable[Any], device: str, ids: set[int]) -> int:
    """State not yet created for the weights in `ids` (those on the device measured)."""
    total = 0
    for wrapped in optimizers:
        optimizer = _innermost(wrapped)
        state = getattr(optimizer, "state", {}) or {}
        for group in getattr(optimizer, "param_groups", []) or []:
            per = _states_per_parameter(optimizer, group)
            for p in group.get("params", []):
                if per and id(p) in ids and getattr(p, "requires_grad", False) and not state.get(p):
                    total += per * _counted(_bytes(p), device)
    return total


def _held(device: str, index: int | None) -> int | None:
    if device == "cuda":
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        return int(cuda.memory_allocated(index)) if cuda is not None else None
    return status_bytes("VmSize")


def measure(model: Any, optimizers: Iterable[Any] = ()) -> FixedMemory | None:
    """The fixed memory of `model` trained by `optimizers` on the device of its first weights;
    None where it cannot be read (no parameters, a device other than CUDA or the CPU, no /proc)."""
    params = list({id(p): p for p in model.parameters()}.values())
    if not params:
        return None
    where = params[0].device
    device = str(getattr(where, "type", where))
    if device not in ("cuda", "cpu"):
        return None
    held = _held(device, getattr(where, "index", None))
    if held is None:
        return None
    # A model split over devices (device_map="auto"): only what lives where the first weights
    # do adds to the memory measured there.
    here = [p for p in params if p.device == where]
    ids = {id(p) for p in here}
    gradients = sum(
        _counted(_bytes(p), device) for p in here if getattr(p, "requires_grad", False) and p.grad is None
    )
    return FixedMemory(
        device=device,
        parameters=sum(int(p.numel()) for p in here),
        held_bytes=held,
        gradient_bytes=gradients,
        optimizer_state_bytes=_optimizer_state_to_come(optimizers, device, ids),
    )


__all__ = ["HOST_FRESH_MAPPING", "FixedMemory", "measure"]
