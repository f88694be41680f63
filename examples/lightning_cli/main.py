"""A LightningCLI project: the model, the data and the Trainer all set from one YAML file.

    python examples/lightning_cli/main.py fit --config examples/lightning_cli/config.yaml

An epoch is one optimizer step's worth of samples (`data.samples_per_epoch`), so every checkpoint
is an end-of-epoch one, which Lightning resumes exactly; from epoch 3 each sample is 512 rows
instead of one, so a large micro-batch runs out of memory there. The config saves no logs
(`logger: false`): LightningCLI then saves the config it ran with as `out/config.yaml`.
"""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES, CLASSES = 512, 10


class Rows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Epoch `epoch`'s samples: the same ones whatever the batch size."""

    def __init__(self, epoch: int, count: int, long_from_epoch: int, long_rows: int) -> None:
        self.first, self.count = epoch * count, count
        self.rows = long_rows if epoch >= long_from_epoch else 1

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(1000 + self.first + index)
        return torch.randn(self.rows, FEATURES, generator=gen), torch.randint(
            0, CLASSES, (self.rows,), generator=gen
        )


class RowsData(L.LightningDataModule):
    def __init__(
        self,
        batch_size: int = 64,
        samples_per_epoch: int = 64,
        long_from_epoch: int = 3,
        long_rows: int = 512,
    ) -> None:
        super().__init__()
        self.batch_size, self.samples_per_epoch = batch_size, samples_per_epoch
        self.long_from_epoch, self.long_rows = long_from_epoch, long_rows

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, torch.Tensor]]:
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        rows = Rows(epoch, self.samples_per_epoch, self.long_from_epoch, self.long_rows)
        return DataLoader(rows, batch_size=self.batch_size, shuffle=False)


class Classifier(L.LightningModule):
    def __init__(self, width: int = 1024, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, CLASSES),
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x.flatten(0, 1)), y.flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"])

    def on_train_end(self) -> None:
        torch.save(self.state_dict(), f"{self.trainer.default_root_dir}/final.pt")


if __name__ == "__main__":
    LightningCLI(Classifier, RowsData)
