"""Device choice, precision resolution, backend switches and memory numbers for runner bodies.

Shared by the training and inference runners. Nothing here allocates on the device except the
small probes that `torch.cuda` itself performs.
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass
from typing import Any, Literal

import psutil
import torch

from gpuwarden.core.errors import UserError
from gpuwarden.sdk.proc_status import status_bytes

Precision = Literal["auto", "bf16", "fp16", "fp32"]
ResolvedPrecision = Literal["bf16", "fp16", "fp32"]

DTYPES: dict[ResolvedPrecision, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}


def select_device(gpus: int | list[str] = 1, allow_cpu: bool = True) -> torch.device:
    """`cuda:0` when a GPU is visible and wanted, else the CPU.

    The daemon narrows CUDA_VISIBLE_DEVICES to the GPUs it picked, so the runner always uses
    index 0. `gpus: 0` asks for the CPU. With no GPU visible and `allow_cpu` false this is a
    user error, since waiting or retrying will not conjure a GPU.
    """
    wants_gpu = gpus != 0
    if wants_gpu and torch.cuda.is_available():
        return torch.device("cuda", 0)
    if wants_gpu and not allow_cpu:
        raise UserError(
            "no CUDA GPU is visible to the run and resources.allow_cpu is false — "
            "check the driver / CUDA_VISIBLE_DEVICES or allow CPU runs",
            code="unsupported",
        )
    return torch.device("cpu")


def bf16_supported(device: torch.device) -> bool:
    """bf16 compute: native on CUDA from Ampere (compute capability 8.0); always emulable on CPU."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    return device.type == "cpu"


@dataclass(frozen=True)
class PrecisionChoice:
    """What precision a run uses, and a warning to emit when it differs from the request."""

    requested: Precision
    used: ResolvedPrecision
    warning: str | None = None

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.used]

    @property
    def autocast(self) -> bool:
        """Mixed precision runs the forward pass under autocast with weights kept in fp32."""
        return self.used != "fp32"

    @property
    def needs_grad_scaler(self) -> bool:
        """fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range."""
        return self.used == "fp16"


def resolve_precision(requested: Precision, device: torch.device) -> PrecisionChoice:
    """Pick the precision for `requested` on `device`.

    - auto: bf16 on CUDA where supported, else fp16 with a warning; fp32 on the CPU (CPU autocast
      is slower than fp32 for the small models one trains on a CPU).
    - bf16: on CUDA without bf16 support it is impossible → UserError; on the CPU it runs under
      bf16 autocast (correct, but slow) with a warning.
    - fp16: CUDA only (loss scaling and fp16 kernels); on the CPU → UserError.
    - fp32: always.
    """
    if requested == "fp32":
        return PrecisionChoice(requested, "fp32")
    if device.type == "cuda":
        if requested == "auto":
            if bf16_supported(device):
                return PrecisionChoice(requested, "bf16")
            return PrecisionChoice(
                requested, "fp16", "this GPU has no native bf16; using fp16 with loss scaling"
            )
        if requested == "bf16" and not bf16_supported(device):
            raise UserError(
                f"precision bf16 is not supported on {torch.cuda.get_device_name(device)} "
                "(needs compute capability ≥ 8.0) — use precision: fp16 or auto",
                code="unsupported",
            )
        return PrecisionChoice(requested, requested)
    if requested == "auto":
        return PrecisionChoice(requested, "fp32")
    if requested == "bf16":
        return PrecisionChoice(requested, "bf16", "bf16 on the CPU runs under autocast and is usually slower")
    raise UserError(
        "precision fp16 needs a CUDA GPU and this run is on the CPU — use precision: auto, bf16 or fp32",
        code="unsupported",
    )


def configure_backends(device: torch.device, *, tf32: bool, cudnn_benchmark: bool) -> None:
    """TF32 matmuls/convolutions and cuDNN autotuning (often set in YAML and never applied).

    Only CUDA is touched: on the CPU "high" matmul precision may select reduced-precision
    kernels, which would break bitwise-reproducible fp32 runs.
    """
    if device.type != "cuda":
        return
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = cudnn_benchmark


def fused_adamw_supported(device: torch.device) -> bool:
    """Fused AdamW kernels exist for CUDA (and, in recent torch, the CPU)."""
    return device.type in ("cuda", "cpu")


@dataclass(frozen=True)
class MemoryStats:
    """Memory numbers in bytes; on the CPU they are the process's resident set."""

    allocated: int | None
    reserved: int | None
    peak: int | None
    num_alloc_retries: int | None
    # Peak address space (CPU): what an RLIMIT_AS limit counts, so the daemon's memory model
    # compares like with like when a host run is retuned under one.
    vm_peak: int | None = None

    def as_progress(self) -> dict[str, Any]:
        """The fields of a `progress` event."""
        return {
            "mem_allocated": self.allocated,
            "mem_reserved": self.reserved,
            "mem_peak": self.peak,
            "num_alloc_retries": self.num_alloc_retries,
            "vm_peak": self.vm_peak,
        }


def _peak_rss() -> int:
    """Peak resident set of this process in bytes (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def memory_stats(device: torch.device) -> MemoryStats:
    """Current, reserved and peak memory for `device`; no device sync is forced on CUDA."""
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        return MemoryStats(
            allocated=int(stats.get("allocated_bytes.all.current", 0)),
            reserved=int(stats.get("reserved_bytes.all.current", 0)),
            peak=int(stats.get("allocated_bytes.all.peak", 0)),
            num_alloc_retries=int(stats.get("num_alloc_retries", 0)),
        )
    rss = int(psutil.Process(os.getpid()).memory_info().rss)
    peak = max(rss, _peak_rss())
    return MemoryStats(
        allocated=rss, reserved=rss, peak=peak, num_alloc_retries=None, vm_peak=status_bytes("VmPeak")
    )


def reset_peak(device: torch.device) -> None:
    """Start a new peak window on CUDA (the CPU peak, ru_maxrss, cannot be reset)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def device_name(device: torch.device) -> str:
    """`cuda:0` or `cpu`, the form used in `started` events."""
    if device.type == "cuda":
        return f"cuda:{device.index or 0}"
    return "cpu"


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (for timing); a no-op on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
