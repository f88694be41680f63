"""Caps each process of a run at $GPUCHECK_MEMORY_FRACTION of its CUDA card: a 12 GB card emulated
on a bigger one, so the caching allocator fails for real (its message says how much is allowed).

This folder goes first on the run's PYTHONPATH; Python imports `sitecustomize` at start-up, before
the runner or a probe runs. `torch.cuda.set_per_process_memory_fraction` works on every torch
release (PYTORCH_ALLOC_CONF's per_process_memory_fraction only from 2.12 on).
"""

import os

_FRACTION = os.environ.get("GPUCHECK_MEMORY_FRACTION")
if _FRACTION:
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(float(_FRACTION))
