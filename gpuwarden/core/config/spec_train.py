"""The `train:` section of a run spec: task, data, and every knob, correct by default."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from gpuwarden.core.config.validation import StrictModel

Precision = Literal["auto", "bf16", "fp16", "fp32"]
# Upper bounds far past any real run, so a typo'd huge number is refused at submission rather than
# crashing the run (sizes past a machine word do not fit the loader's and the kernel's integers).
MAX_BATCH = 1 << 20
MAX_COUNT = 1 << 40


class ImageModelSpec(StrictModel):
    """A plain-torch residual CNN (an image-restoration model, a small CAPTCHA solver)."""

    mode: Literal["restoration", "keypoints"] = "restoration"
    base_channels: int = Field(64, gt=0, le=4096)
    num_blocks: int = Field(8, gt=0, le=512)
    patch_size: int = Field(128, ge=8, le=8192, description="training crop size in pixels")
    in_channels: int = Field(3, gt=0, le=64)
    num_keypoints: int = Field(8, gt=0, le=1024, description="keypoints mode: points to regress")
    synthetic_samples: int = Field(
        2048, gt=0, le=MAX_COUNT, description="with no data folder: size of the synthetic generator's epoch"
    )
    noise_std: float = Field(0.1, ge=0, le=10, description="restoration: noise added to inputs")


class OptimizerSpec(StrictModel):
    name: Literal["adamw"] = "adamw"
    lr: float = Field(3e-4, gt=0, le=10)
    weight_decay: float = Field(0.01, ge=0, le=10)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    fused: Literal["auto", True, False] = Field(
        "auto", description="fused AdamW where the device supports it, else foreach"
    )


class SchedulerSpec(StrictModel):
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_steps: int = Field(0, ge=0, le=MAX_COUNT)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)


class TrainSpec(StrictModel):
    """What to train and how. Step counts are optimizer steps; data position is samples seen."""

    task: Literal["causal_lm", "image"]
    model: Path | None = Field(None, description="causal_lm: a local transformers model directory")
    tokenizer: Path | None = Field(None, description="causal_lm: tokenizer directory (default: model)")
    data: Path | None = Field(
        None, description="causal_lm: JSON/JSONL file of texts; image: folder of images (none = synthetic)"
    )
    text_field: str = "text"
    max_length: int = Field(512, gt=0, le=1_048_576)
    packing: bool = Field(False, description="causal_lm: concatenate texts into full-length blocks")
    image: ImageModelSpec = Field(default_factory=ImageModelSpec)

    batch_size: int = Field(8, gt=0, le=MAX_BATCH, description="micro-batch per device")
    grad_accum_steps: int = Field(1, ge=1, le=MAX_BATCH)
    world_size: int = Field(
        1,
        ge=1,
        le=4096,
        description="processes (one per GPU, or CPU ranks) in data-parallel training, via torchrun",
    )
    collective_timeout: int = Field(
        600,
        ge=1,
        le=7 * 86_400,
        description="seconds a rank waits for the others in a collective before failing",
    )
    max_steps: int | None = Field(None, gt=0, le=MAX_COUNT, description="optimizer steps; default: epochs")
    epochs: float = Field(1.0, gt=0, le=1_000_000)

    precision: Precision = "auto"
    amp: bool | None = Field(
        None, description="legacy switch: true = mixed precision (bf16 where supported, else fp16)"
    )
    compile: bool = False
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = "default"
    tf32: bool = True
    cudnn_benchmark: bool = True
    channels_last: bool = True
    gradient_checkpointing: bool = False
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    grad_clip: float | None = Field(1.0, gt=0)

    num_workers: int | Literal["auto"] = "auto"
    pin_memory: bool | Literal["auto"] = "auto"
    persistent_workers: bool = True
    prefetch_factor: int = Field(2, ge=1, le=64)

    log_interval: int = Field(
        10, ge=1, le=MAX_COUNT, description="steps between progress events (each one syncs)"
    )
    checkpoint_interval: int = Field(
        100, ge=1, le=MAX_COUNT, description="optimizer steps between checkpoints"
    )
    keep_checkpoints: int = Field(2, ge=1, le=100)
    seed: int = Field(0, ge=-(2**63), le=2**64 - 1)

    @property
    def effective_batch(self) -> int:
        return self.batch_size * self.grad_accum_steps * self.world_size

    @model_validator(mode="after")
    def _consistent(self) -> TrainSpec:
        if isinstance(self.num_workers, int) and self.num_workers < 0:
            raise ValueError("num_workers must be ≥ 0 or 'auto'")
        if self.task == "causal_lm":
            if self.model is None:
                raise ValueError("task 'causal_lm' needs `model:` — a local transformers model directory")
            if self.data is None:
                raise ValueError("task 'causal_lm' needs `data:` — a JSON or JSONL file of texts")
        if self.amp is not None and self.precision != "auto" and (self.amp != (self.precision != "fp32")):
            raise ValueError(
                f"amp: {str(self.amp).lower()} contradicts precision: {self.precision}"
                " — keep only `precision`"
            )
        return self

    def resolved_precision_request(self) -> Precision:
        """`amp: true` means mixed precision (scripts that compare it with 'bf16' silently run fp32)."""
        if self.amp is True and self.precision == "auto":
            return "auto"
        if self.amp is False:
            return "fp32"
        return self.precision
