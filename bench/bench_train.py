"""Training-loop throughput: gpuwarden's loop against a naive loop and a hand-tuned one.

All three train the same residual CNN (the image task's model) on the same synthetic
restoration data for the same number of optimizer steps. Each is timed from the end of its
warm-up steps (`Work.warmup`) to its last step (device-synchronised), so compilation, cuDNN's
algorithm search and the allocator's first growth count for none of them; samples/s is the
steady rate. On a GPU the
model and images are larger (`GPU_WORK`): the CPU's size takes a millisecond a step on an H100,
where only launch and Python overhead would be measured.

- naive: a typical starting point — fp32, no compile, `loss.item()` after every step (a host–
  device sync), AdamW without fused/foreach kernels, a DataLoader with default settings;
- hand-tuned: what a careful engineer writes — autocast (bf16 on a GPU that has it), fused
  AdamW, no per-step sync, channels_last, pinned memory and workers on a GPU, compile on a GPU;
- gpuwarden: the real runner body (`gpuwarden.runners.train.main.run`) with default knobs, except
  `compile: true` on a GPU so that it is compared like for like; samples/s is its report's figure.

Targets (GPU): gpuwarden ≥ 1.5 × naive and ≥ 0.95 × hand-tuned, on the median of `REPEATS`
rounds. On a CPU, mixed precision and removed syncs buy nothing, so the first ratio is reported
without a verdict there, while the second is checked everywhere.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.figures import REPEATS, figure_row, main_for, paired_ratios

LOG_INTERVAL = 10


@dataclass(frozen=True)
class Work:
    """How much each loop trains: optimizer steps, the first `warmup` of them untimed."""

    steps: int
    warmup: int
    batch: int
    image: dict[str, Any]


CPU_WORK = Work(
    steps=60,
    warmup=10,
    batch=16,
    image={"mode": "restoration", "base_channels": 24, "num_blocks": 3, "patch_size": 32}
    | {"synthetic_samples": 512},
)
GPU_WORK = Work(
    steps=120,
    warmup=20,
    batch=64,
    image={"mode": "restoration", "base_channels": 64, "num_blocks": 8, "patch_size": 128}
    | {"synthetic_samples": 2048},
)


def _work(device: torch.device) -> Work:
    return GPU_WORK if device.type == "cuda" else CPU_WORK


def _spec_section(work: Work, cuda: bool) -> dict[str, Any]:
    return {
        "task": "image",
        "image": work.image,
        "batch_size": work.batch,
        "max_steps": work.steps,
        "log_interval": LOG_INTERVAL,
        "checkpoint_interval": 10_000,
        "compile": cuda,
        "grad_clip": None,
        "seed": 0,
    }


def _dataset_and_model(work: Work) -> tuple[Any, torch.nn.Module]:
    from gpuwarden.core.config.spec_train import ImageModelSpec
    from gpuwarden.runners.train.image import ResidualCNN, SyntheticImages

    cfg = ImageModelSpec.model_validate(work.image)
    torch.manual_seed(0)
    return SyntheticImages(cfg, seed=0), ResidualCNN(cfg)


class _Flat(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """The synthetic images addressed by plain indices (epoch 0), for ordinary DataLoaders."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        sample: tuple[torch.Tensor, torch.Tensor] = self.inner[(0, i)]
        return sample


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def naive_loop(device: torch.device) -> float:
    """Samples/s of the naive starting loop."""
    work = _work(device)
    data, model = _dataset_and_model(work)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False, fused=False)
    loader = torch.utils.data.DataLoader(_Flat(data), batch_size=work.batch, shuffle=True)
    losses = []
    start = time.perf_counter()
    steps = 0
    while steps < work.steps:
        for noisy, clean in loader:
            noisy, clean = noisy.to(device), clean.to(device)
            loss = (model(noisy) - clean).abs().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())  # the per-step sync that slows naive loops
            steps += 1
            if steps == work.warmup:
                start = time.perf_counter()
            if steps == work.steps:
                break
    _sync(device)
    return (work.steps - work.warmup) * work.batch / (time.perf_counter() - start)


def hand_tuned_loop(device: torch.device) -> float:
    """Samples/s of a carefully written loop for the same model and data."""
    work = _work(device)
    data, model = _dataset_and_model(work)
    cuda = device.type == "cuda"
    model.to(device).train()
    model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    if cuda:
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    forward = torch.compile(model) if cuda else model
    use_bf16 = cuda and torch.cuda.is_bf16_supported()
    workers = min(4, (os.cpu_count() or 1) - 1) if cuda else 0
    loader = torch.utils.data.DataLoader(
        _Flat(data), batch_size=work.batch, shuffle=True, pin_memory=cuda, num_workers=workers, drop_last=True
    )
    running = torch.zeros((), device=device)
    start = time.perf_counter()
    steps = 0
    while steps < work.steps:
        for noisy, clean in loader:
            noisy = noisy.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
            clean = clean.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                loss = (forward(noisy).float() - clean).abs().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            running += loss.detach()
            steps += 1
            if steps == work.warmup:
                _sync(device)  # the one sync before the last step: where the timing starts
                start = time.perf_counter()
            if steps == work.steps:
                break
    running.item()
    _sync(device)
    return (work.steps - work.warmup) * work.batch / (time.perf_counter() - start)


def gpuwarden_loop(device: torch.device, root: Path) -> float:
    """Samples/s of the gpuwarden runner between its progress reports at the end of the warm-up
    and at the last step (each is written after a device sync)."""
    from gpuwarden.core.config.spec import spec_from_mapping
    from gpuwarden.runners.events import EventWriter
    from gpuwarden.runners.train.main import run as run_train

    cuda = device.type == "cuda"
    work = _work(device)
    spec = spec_from_mapping(
        {
            "name": "bench-train",
            "kind": "train",
            "resources": {"gpus": 1 if cuda else 0},
            "train": _spec_section(work, cuda),
        }
    )
    run_dir = root / "gpuwarden"
    with EventWriter(run_dir / "events.jsonl") as events:
        rc = run_train(spec, run_dir, 1, events)
    if rc != 0:
        raise RuntimeError(f"the training runner exited {rc}: see {run_dir}")
    lines = (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()
    progress = [e for e in map(json.loads, lines) if e.get("type") == "progress"]
    warm = next(e for e in progress if e["step"] >= work.warmup)
    last = progress[-1]
    return float((last["samples_seen"] - warm["samples_seen"]) / (last["ts"] - warm["ts"]))


def run() -> list[dict[str, Any]]:
    """Rows for `python -m bench`: samples/s of the three loops and the two ratios, each the
    median of `REPEATS` rounds that run the three loops one after another."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    naive, tuned, ours = [], [], []
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-train-") as tmp:
        for rep in range(REPEATS):
            naive.append(naive_loop(device))
            tuned.append(hand_tuned_loop(device))
            ours.append(gpuwarden_loop(device, Path(tmp) / str(rep)))
    where = "GPU" if cuda else "CPU"
    return [
        figure_row(f"train naive loop ({where})", naive, "samples/s"),
        figure_row(f"train hand-tuned loop ({where})", tuned, "samples/s"),
        figure_row(f"train gpuwarden loop ({where})", ours, "samples/s"),
        figure_row(
            "train gpuwarden / naive",
            paired_ratios(ours, naive),
            "×",
            target="≥ 1.5" if cuda else "≥ 1.5 on a GPU (not checked on a CPU)",
            check=(lambda v: v >= 1.5) if cuda else None,
        ),
        figure_row(
            "train gpuwarden / hand-tuned",
            paired_ratios(ours, tuned),
            "×",
            target="≥ 0.95",
            check=lambda v: v >= 0.95,
        ),
    ]


if __name__ == "__main__":
    raise SystemExit(main_for(run))
