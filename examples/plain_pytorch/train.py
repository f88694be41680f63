"""A plain PyTorch training script with a YAML config, as people write them.

    python examples/plain_pytorch/train.py --config examples/plain_pytorch/config.yaml

It uses gpuwarden's small SDK (five lines, marked "gpuwarden:"): the memory the model holds
whatever the micro-batch, progress with memory, checkpoint events, and an OOM guard that saves a
checkpoint and exits 3 on an out-of-memory.
Outside gpuwarden those lines do nothing. The loss is averaged over the whole optimizer step
(not per micro-batch), so micro-batch 16 × 1 and 4 × 4 train the same model.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from gpuwarden import sdk


def build_model(cfg: dict[str, Any]) -> nn.Module:
    m = cfg["model"]
    return nn.Sequential(
        nn.Embedding(m["vocab"], m["hidden"]),
        nn.Linear(m["hidden"], m["width"]),
        nn.GELU(),
        nn.Linear(m["width"], m["hidden"]),
        nn.GELU(),
        nn.Linear(m["hidden"], m["vocab"]),
    )


def sample(cfg: dict[str, Any], index: int) -> torch.Tensor:
    """Sample `index` of a synthetic corpus: the same tokens whatever the batch size."""
    d = cfg["data"]
    length = d["short_length"] if index < d["long_after"] else d["loading"]["max_length"]
    length = min(length, d["loading"]["max_length"])
    gen = torch.Generator().manual_seed(cfg["seed"] * 100_003 + index)
    return torch.randint(0, cfg["model"]["vocab"], (length,), generator=gen)


def batch_loss(model: nn.Module, seqs: list[torch.Tensor]) -> torch.Tensor:
    """Sum over the sequences of each one's mean next-token loss (padding masked out)."""
    width = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width - 1)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
        mask[i, : len(s) - 1] = 1
    logits = model(tokens[:, :-1])
    losses = nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    return ((losses * mask).sum(1) / mask.sum(1)).sum()


def save(out: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer, seen: int) -> Path:
    """checkpoint-<step>/state.pt, written under a temporary name and renamed into place."""
    final = out / f"checkpoint-{step}"
    if (final / "state.pt").exists():
        return final
    tmp = out / f".checkpoint-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "seen": seen}
    torch.save(state, tmp / "state.pt")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--resume", type=Path, default=None, help="a checkpoint-<step> folder")
    args = parser.parse_args()
    cfg = yaml.safe_load(args.config.read_text())
    t = cfg["training"]
    micro, accum = int(t["batch_size"]), int(t["gradient_accumulation_steps"])
    effective = micro * accum
    out = Path(t["output_dir"])
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(cfg["seed"])
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=t["lr"])
    step, seen = 0, 0
    if args.resume is not None:
        state = torch.load(args.resume / "state.pt", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, seen = state["step"], state["seen"]
        print(f"resumed from {args.resume} at step {step} ({seen} samples)", flush=True)
    print(f"micro-batch {micro} × accumulation {accum} = effective batch {effective}", flush=True)
    sdk.fixed_memory(model, opt)  # gpuwarden: weights held, gradients and optimizer state to come

    # gpuwarden: on an out-of-memory, save the last completed step and exit 3 for a retune.
    with sdk.oom_guard(save=lambda: str(save(out, step, model, opt, seen)), batch_size=micro) as guard:
        while step < t["max_steps"]:
            guard.step, guard.samples_seen = step, seen
            total = torch.zeros(())
            for m in range(accum):
                first = seen + m * micro
                loss = batch_loss(model, [sample(cfg, i) for i in range(first, first + micro)]) / effective
                loss.backward()
                total += loss.detach()
            with guard.updating():
                opt.step()
                opt.zero_grad(set_to_none=True)
            step, seen = step + 1, seen + effective
            print(f"step {step}: loss {total.item():.4f}", flush=True)
            sdk.progress(step, seen, loss=total.item(), batch_size=micro)  # gpuwarden: progress
            if step % t["checkpoint_every"] == 0:
                path = save(out, step, model, opt, seen)
                sdk.checkpoint(str(path), step, seen)  # gpuwarden: a checkpoint to resume from
    torch.save(model.state_dict(), out / "final.pt")
    print(f"done: {step} steps, {seen} samples; weights in {out / 'final.pt'}", flush=True)


if __name__ == "__main__":
    main()
