"""A training script configured by Hydra: `conf/config.yaml`, overridden on the command line.

    python examples/hydra/train.py training.batch_size=32 training.grad_accum=2

A plain PyTorch loop over synthetic samples that are the same whatever the micro-batch; from
`long_from_step` each sample is 512 rows instead of one, so a large micro-batch runs out of
memory there. It checkpoints every `checkpoint_every` steps into `training.out` and goes on from
`training.resume` when given one; the final weights are `out/final.pt`.
"""

from __future__ import annotations

from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig
from torch import nn

FEATURES, CLASSES, LONG_ROWS = 512, 10, 512


def batch(step: int, size: int, long_from: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s samples (the effective batch), the same whatever the micro-batch."""
    gen = torch.Generator().manual_seed(1000 + step)
    rows = 1 if step < long_from else LONG_ROWS
    return torch.randn(size, rows, FEATURES, generator=gen), torch.randint(
        0, CLASSES, (size, rows), generator=gen
    )


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    t = cfg.training
    torch.manual_seed(0)
    width = cfg.model.width
    model = nn.Sequential(
        nn.Linear(FEATURES, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, CLASSES)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = 0
    if t.resume:
        state = torch.load(t.resume, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        print(f"resumed from {t.resume} at step {start}", flush=True)
    out = Path(t.out)
    out.mkdir(parents=True, exist_ok=True)
    for step in range(start, t.steps):
        x, y = batch(step, t.batch_size * t.grad_accum, t.long_from_step)
        optimizer.zero_grad()
        for part in range(t.grad_accum):
            rows = slice(part * t.batch_size, (part + 1) * t.batch_size)
            loss = nn.functional.cross_entropy(model(x[rows].flatten(0, 1)), y[rows].flatten()) / t.grad_accum
            loss.backward()
        optimizer.step()
        print(f"step {step + 1} loss {loss.item() * t.grad_accum:.4f}", flush=True)
        if (step + 1) % t.checkpoint_every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}
            torch.save(state, out / f"step_{step + 1}.pt")
    torch.save(model.state_dict(), out / "final.pt")


if __name__ == "__main__":
    main()
