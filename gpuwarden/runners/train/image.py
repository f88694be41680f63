"""Image training with a plain-torch residual CNN: restoration (noisy → clean) or keypoints.

- restoration: the model predicts the clean image from one with Gaussian noise (`noise_std`)
  added; L1 loss (the usual image-restoration setting). Training samples are random
  `patch_size` crops.
- keypoints: the model regresses `num_keypoints` (x, y) positions in [0, 1]; MSE loss. Images
  are resized to `patch_size` × `patch_size` so labels stay valid. Coordinate channels are
  appended to the input (CoordConv) so a pooled head can localise at all.

Data: a folder of images (labels for keypoints in `keypoints.json`: `{"file.png": [[x, y], …]}`)
or, with `data` unset, a deterministic synthetic generator of `synthetic_samples` items. Every
random choice of a sample (crop, noise) comes from a generator seeded by (seed, epoch, index),
so the data do not depend on batch size, worker count or resumes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import Dataset

from gpuwarden.core.config.spec_train import ImageModelSpec, TrainSpec
from gpuwarden.core.errors import UserError
from gpuwarden.runners.train.sampling import SampleKey, mix_seed, sample_generator
from gpuwarden.runners.train.task import Batch, PreparedTask

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
Sample = tuple[torch.Tensor, torch.Tensor]


class ResidualBlock(nn.Module):
    """conv → SiLU → conv, added to the input."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.conv2(F.silu(self.conv1(x)))
        return out


def coord_channels(x: torch.Tensor) -> torch.Tensor:
    """Two channels holding each pixel's x and y in [0, 1], shaped like `x`'s batch."""
    b, _, h, w = x.shape
    ys = torch.linspace(0, 1, h, device=x.device, dtype=x.dtype).view(1, 1, h, 1).expand(b, 1, h, w)
    xs = torch.linspace(0, 1, w, device=x.device, dtype=x.dtype).view(1, 1, 1, w).expand(b, 1, h, w)
    return torch.cat([xs, ys], dim=1)


class ResidualCNN(nn.Module):
    """Stem conv, `num_blocks` residual blocks of `base_channels`, then a task head."""

    def __init__(self, cfg: ImageModelSpec) -> None:
        super().__init__()
        self.mode = cfg.mode
        self.num_keypoints = cfg.num_keypoints
        extra = 2 if cfg.mode == "keypoints" else 0
        self.stem = nn.Conv2d(cfg.in_channels + extra, cfg.base_channels, 3, padding=1)
        self.blocks = nn.ModuleList(ResidualBlock(cfg.base_channels) for _ in range(cfg.num_blocks))
        self.head: nn.Module
        if cfg.mode == "restoration":
            self.head = nn.Conv2d(cfg.base_channels, cfg.in_channels, 3, padding=1)
        else:
            self.head = nn.Sequential(
                nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cfg.base_channels, 2 * cfg.num_keypoints)
            )
        # set by gradient_checkpointing: recompute each block in backward instead of storing it
        self.checkpoint_blocks = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp = torch.cat([x, coord_channels(x)], dim=1) if self.mode == "keypoints" else x
        h = F.silu(self.stem(inp))
        for block in self.blocks:
            if self.checkpoint_blocks and self.training and torch.is_grad_enabled():
                h = checkpoint(block, h, use_reentrant=False)
            else:
                h = block(h)
        if self.mode == "restoration":
            out: torch.Tensor = x + self.head(h)  # predict the residual: noise is small
            return out
        return torch.sigmoid(self.head(h)).view(-1, self.num_keypoints, 2)


def image_loss_sum(model: nn.Module, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum over samples of each sample's mean loss (L1 for restoration, MSE for keypoints)."""
    pred: torch.Tensor = model(tensors["input"]).float()
    target = tensors["target"].float()
    dims = tuple(range(1, pred.dim()))
    if pred.dim() == 4:
        return (pred - target).abs().mean(dim=dims).sum()
    return ((pred - target) ** 2).mean(dim=dims).sum()


class SyntheticImages(Dataset[Sample]):
    """Deterministic smooth images; per item the clean image depends on (seed, index) only."""

    def __init__(self, cfg: ImageModelSpec, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed

    def __len__(self) -> int:
        return self.cfg.synthetic_samples

    def __getitem__(self, key: SampleKey) -> Sample:
        epoch, index = key
        cfg = self.cfg
        gen = torch.Generator().manual_seed(mix_seed(self.seed, index, 0x1A9E))
        size = cfg.patch_size
        coarse = torch.rand((1, cfg.in_channels, 6, 6), generator=gen)
        clean = F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)[0] * 0.6
        if cfg.mode == "keypoints":
            points = torch.rand((cfg.num_keypoints, 2), generator=gen) * 0.8 + 0.1
            grid = torch.linspace(0, 1, size)
            sigma = max(1.5 / size, 1 / 24)
            for x, y in points.tolist():
                blob = torch.exp(
                    -((grid.view(1, -1) - x) ** 2 + (grid.view(-1, 1) - y) ** 2) / (2 * sigma**2)
                )
                clean = clean + 0.4 * blob
            return clean.clamp(0, 1), points
        noise = torch.randn(clean.shape, generator=sample_generator(self.seed, epoch, index)) * cfg.noise_std
        return clean + noise, clean


def _open_image(path: Path, mode: str) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img.load()
            return img.convert(mode)
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise UserError(
            f"cannot read image {path}: {exc} — remove or replace the file", code="bad_data"
        ) from None


def _to_tensor(img: Any) -> torch.Tensor:
    arr = np.asarray(img, dtype=np.uint8)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div_(255.0)


class FolderImages(Dataset[Sample]):
    """Images from a folder: random crops (restoration) or whole resized images (keypoints)."""

    def __init__(self, folder: Path, cfg: ImageModelSpec, seed: int) -> None:
        from PIL import Image, UnidentifiedImageError

        if not folder.is_dir():
            raise UserError(f"image folder {folder} does not exist — check train.data", code="bad_data")
        if cfg.in_channels not in (1, 3):
            raise UserError(
                f"image.in_channels is {cfg.in_channels}; image folders give 1 (grey) or 3 (RGB) channels",
                code="bad_data",
            )
        self.files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not self.files:
            raise UserError(
                f"{folder} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})", code="bad_data"
            )
        # read every header now: a broken file is reported up front by name, not mid-run
        for path in self.files:
            try:
                with Image.open(path) as img:
                    img.verify()
            except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as exc:
                raise UserError(
                    f"cannot read image {path}: {exc} — remove or replace the file", code="bad_data"
                ) from None
        self.cfg = cfg
        self.seed = seed
        self.mode = "RGB" if cfg.in_channels == 3 else "L"
        self.labels: dict[str, torch.Tensor] = {}
        if cfg.mode == "keypoints":
            self.labels = self._read_labels(folder)

    def _read_labels(self, folder: Path) -> dict[str, torch.Tensor]:
        path = folder / "keypoints.json"
        if not path.is_file():
            raise UserError(
                f"keypoints mode needs {path} mapping file names to [[x, y], …] in [0, 1]", code="bad_data"
            )
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise UserError(f"cannot read {path}: {exc}", code="bad_data") from None
        labels: dict[str, torch.Tensor] = {}
        for file in self.files:
            points = raw.get(file.name) if isinstance(raw, dict) else None
            try:
                tensor = torch.tensor(points, dtype=torch.float32)
            except (TypeError, ValueError):
                tensor = torch.empty(0)
            if tensor.shape != (self.cfg.num_keypoints, 2):
                raise UserError(
                    f"{path}: '{file.name}' needs {self.cfg.num_keypoints} points as [[x, y], …]",
                    code="bad_data",
                )
            labels[file.name] = tensor
        return labels

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, key: SampleKey) -> Sample:
        from PIL import Image

        epoch, index = key
        path = self.files[index]
        img = _open_image(path, self.mode)
        size = self.cfg.patch_size
        if self.cfg.mode == "keypoints":
            img = img.resize((size, size), Image.Resampling.BILINEAR)
            return _to_tensor(img), self.labels[path.name]
        gen = sample_generator(self.seed, epoch, index)
        w, h = img.size
        if min(w, h) < size:
            scale = size / min(w, h)
            img = img.resize(
                (max(size, round(w * scale)), max(size, round(h * scale))), Image.Resampling.BICUBIC
            )
            w, h = img.size
        left = int(torch.randint(0, w - size + 1, (1,), generator=gen))
        top = int(torch.randint(0, h - size + 1, (1,), generator=gen))
        clean = _to_tensor(img.crop((left, top, left + size, top + size)))
        noise = torch.randn(clean.shape, generator=gen) * self.cfg.noise_std
        return clean + noise, clean


def collate_images(samples: list[Sample]) -> Batch:
    inputs = torch.stack([s[0] for s in samples])
    targets = torch.stack([s[1] for s in samples])
    return Batch({"input": inputs, "target": targets}, len(samples), units=len(samples))


def prepare_image(spec: TrainSpec) -> PreparedTask:
    """Build the CNN (initialised from `spec.seed`) and the folder or synthetic dataset."""
    cfg = spec.image
    dataset: Dataset[Sample]
    if spec.data is None:
        dataset = SyntheticImages(cfg, spec.seed)
        num_samples = cfg.synthetic_samples
        source = "synthetic"
    else:
        folder = FolderImages(spec.data, cfg, spec.seed)
        dataset, num_samples, source = folder, len(folder), str(spec.data)
    # initialise the weights from the run's seed without disturbing the global generator
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(mix_seed(spec.seed, 0xC0DE))
        model = ResidualCNN(cfg)

    def enable_checkpointing() -> None:
        model.checkpoint_blocks = True

    def export(trained: nn.Module, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        torch.save(trained.state_dict(), out_dir / "model.pt")
        (out_dir / "config.json").write_text(
            json.dumps(cfg.model_dump(mode="json"), indent=1), encoding="utf-8"
        )

    return PreparedTask(
        name="image",
        model=model,
        dataset=dataset,
        num_samples=num_samples,
        collate=collate_images,
        loss_sum=image_loss_sum,
        image_like=True,
        enable_gradient_checkpointing=enable_checkpointing,
        export=export,
        summary={"mode": cfg.mode, "source": source, "samples": num_samples},
    )
