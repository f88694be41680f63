"""The `infer:` section of a run spec: batched generation and image-to-text."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from gpuwarden.core.config.spec_train import MAX_BATCH, MAX_COUNT, Precision
from gpuwarden.core.config.validation import StrictModel


class InferSpec(StrictModel):
    """Inference over a file of prompts or a folder of images; resumable item by item."""

    task: Literal["generate", "image_to_text"]
    model: Path = Field(description="a local transformers model directory")
    input: Path = Field(description="generate: JSONL of prompts; image_to_text: a folder of images")
    output: Path | None = Field(None, description="default: the run's outputs/ directory")
    prompt_field: str = "prompt"
    id_field: str = "id"
    prompt: str | None = Field(None, description="image_to_text: the instruction sent with each image")
    output_format: Literal["markdown", "json"] = "markdown"

    batch_size: int = Field(8, gt=0, le=MAX_BATCH)
    max_new_tokens: int = Field(256, gt=0, le=1_048_576)
    max_input_length: int | None = Field(None, gt=0, le=1 << 24)
    do_sample: bool = False
    temperature: float = Field(1.0, gt=0)
    precision: Precision = "auto"
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    kv_cache: Literal["dynamic", "static"] = "dynamic"
    compile: bool = False
    max_memory: dict[str, str] | None = Field(
        None, description='accelerate budget per device, e.g. {"0": "15GiB", "cpu": "30GiB"}'
    )
    device_map: Literal["auto", "none"] | None = None
    load_in_8bit: bool = Field(False, description="bitsandbytes 8-bit weights (CUDA only)")
    max_pixels: int | None = Field(None, gt=0, le=MAX_COUNT)
    min_pixels: int | None = Field(None, gt=0, le=MAX_COUNT)
    seed: int = Field(0, ge=-(2**63), le=2**64 - 1)

    @model_validator(mode="after")
    def _consistent(self) -> InferSpec:
        if self.min_pixels and self.max_pixels and self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels ({self.min_pixels}) is above max_pixels ({self.max_pixels})")
        if self.task == "image_to_text" and self.output_format not in ("markdown", "json"):
            raise ValueError("output_format must be markdown or json")
        return self
