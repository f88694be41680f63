"""A Lightning training script: a LightningModule, a data module, Trainer flags on the command line.

    python examples/lightning/train.py --batch_size 16 --default_root_dir out

One epoch is one optimizer step's worth of samples (batch_size × accumulate_grad_batches), so
every checkpoint is an end-of-epoch one, which Lightning resumes exactly; long sequences start
at epoch 3. `--gpuwarden_callback` adds gpuwarden's Lightning callback (progress with memory,
checkpoint events, an OOM turned into an `oom` event and exit 3); without it gpuwarden still
recovers the run from stderr, the exit status and the *.ckpt files.
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn

VOCAB, HIDDEN, WIDTH = 256, 16, 4096
SHORT, LONG, LONG_AFTER = 32, 1024, 48


def sample(index: int, seed: int = 0) -> torch.Tensor:
    """Sample `index` of a synthetic corpus: the same tokens whatever the batch size."""
    length = SHORT if index < LONG_AFTER else LONG
    gen = torch.Generator().manual_seed(seed * 100_003 + index)
    return torch.randint(0, VOCAB, (length,), generator=gen)


def collate(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width - 1)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
        mask[i, : len(s) - 1] = 1
    return tokens, mask


class Epochs(L.LightningDataModule):
    """Epoch e holds samples [e × per_epoch, (e + 1) × per_epoch), in order."""

    def __init__(self, batch_size: int, per_epoch: int) -> None:
        super().__init__()
        self.batch_size, self.per_epoch = batch_size, per_epoch

    def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        first = self.trainer.current_epoch * self.per_epoch
        data = [sample(i) for i in range(first, first + self.per_epoch)]
        return torch.utils.data.DataLoader(data, batch_size=self.batch_size, collate_fn=collate)


class TokenModel(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(
            nn.Embedding(VOCAB, HIDDEN),
            nn.Linear(HIDDEN, WIDTH),
            nn.GELU(),
            nn.Linear(WIDTH, HIDDEN),
            nn.GELU(),
            nn.Linear(HIDDEN, VOCAB),
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        tokens, mask = batch
        logits = self.net(tokens[:, :-1])
        losses = nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
        # Mean over samples of each one's mean token loss; Lightning divides by the accumulation.
        return ((losses * mask).sum(1) / mask.sum(1)).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--accumulate_grad_batches", type=int, default=1)
    parser.add_argument("--max_epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--default_root_dir", default="lightning-out")
    parser.add_argument("--ckpt_path", default=None, help="a checkpoint to resume from")
    parser.add_argument("--gpuwarden_callback", action="store_true")
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    callbacks: list[Callback] = [
        ModelCheckpoint(dirpath=f"{args.default_root_dir}/checkpoints", filename="{step}", save_top_k=-1)
    ]
    if args.gpuwarden_callback:
        from gpuwarden.sdk.lightning import GpuwardenCallback

        callbacks.append(GpuwardenCallback())
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=args.max_epochs,
        accumulate_grad_batches=args.accumulate_grad_batches,
        default_root_dir=args.default_root_dir,
        callbacks=callbacks,
        reload_dataloaders_every_n_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    model = TokenModel(args.lr)
    data = Epochs(args.batch_size, args.batch_size * args.accumulate_grad_batches)
    trainer.fit(model, datamodule=data, ckpt_path=args.ckpt_path)
    torch.save(model.state_dict(), f"{args.default_root_dir}/final.pt")
    print(f"done: {trainer.global_step} steps", flush=True)


if __name__ == "__main__":
    main()
