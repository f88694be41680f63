"""On a GPU, the fixed-memory bound the SDK measures against the caching allocator's peak."""

from __future__ import annotations

import pytest
import torch

from gpuwarden.sdk.fixed_memory import measure


@pytest.mark.gpu
def test_on_cuda_the_bound_stays_below_the_allocators_peak() -> None:
    """On a GPU the held part is the caching allocator's allocated bytes and every tensor to come
    counts: the bound is under the peak the steps reach, and close to it."""
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(3)]).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    fixed = measure(model, [optimizer])
    assert fixed is not None and fixed.device == "cuda"
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert fixed.gradient_bytes == weights and fixed.optimizer_state_bytes == 2 * weights
    for _ in range(2):
        model(torch.randn(4, 4096, device="cuda")).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    peak = torch.cuda.max_memory_allocated()
    assert fixed.fixed_bytes <= peak
    assert fixed.fixed_bytes - base >= 0.9 * (peak - base)
