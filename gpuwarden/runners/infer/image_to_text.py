"""`task: image_to_text` — a local vision-language model over a folder of images (document parsing).

Two model shapes are handled through transformers' Auto classes, without assuming torchvision:

- encoder–decoder (TrOCR-style `VisionEncoderDecoderModel`, Donut, …): the image processor makes
  `pixel_values`; `prompt`, when given, is the start of the decoder's text.
- decoder-only VLMs with a multimodal processor (Qwen2-VL, LLaVA, …): the prompt and an image
  placeholder go through the processor's chat template; the processor expands the image tokens.

`max_pixels`/`min_pixels` go to the image processor when it accepts them (Qwen2-VL's dynamic
resolution); for any other processor the image is resized first so that w×h stays within them,
keeping the aspect ratio.

Outputs, one per image: `<stem>.md` (the text) or `<stem>.json` (text plus metadata), written
under a temporary name and renamed, plus `index.jsonl` with one row per image (status ok or
failed). Images whose names share a stem (`a.png`, `a.jpg`) get the full name (`a.png.md`).

Resume rules: an image whose output file exists is done; an image recorded as failed in the
index is not retried (it is unreadable; delete its index line to try again); an output file with
no index row (the attempt died between the rename and the index write) gets its row on the next
start. An unreadable image is a `warning` event naming the file and a `failed` index row; the run
goes on.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from gpuwarden.core.config.spec_infer import InferSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.events import EXIT_OK, EXIT_TERMINATED, Finished, Started
from gpuwarden.runners.infer.common import (
    InferContext,
    check_offload,
    generation_kwargs,
    is_compile_failure,
    load_kwargs,
    load_with_attention,
    maybe_compile,
    oom_exit,
    place_model,
    timed_sync,
)
from gpuwarden.runners.infer.outputs import JsonlOutput, remove_stale_temps, write_file_atomic
from gpuwarden.runners.stop import STOP

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff"})
INDEX_NAME = "index.jsonl"
UNREADABLE = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def output_dir(output: Path | None, run_dir: Path) -> Path:
    """`output` (a folder), by default `RUN_DIR/outputs`."""
    return output if output is not None else run_dir / "outputs"


def list_images(folder: Path) -> list[Path]:
    """Image files directly in `folder` (not in sub-folders), hidden files skipped, sorted by name."""
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_SUFFIXES
    )


def output_names(images: Iterable[Path], extension: str) -> dict[str, str]:
    """Output file name per image name: `<stem><ext>`, or `<name><ext>` where stems collide."""
    images = list(images)
    stems: dict[str, int] = {}
    for image in images:
        stems[image.stem] = stems.get(image.stem, 0) + 1
    return {
        image.name: (image.stem if stems[image.stem] == 1 else image.name) + extension for image in images
    }


def fit_pixels(size: tuple[int, int], max_pixels: int | None, min_pixels: int | None) -> tuple[int, int]:
    """(w, h) scaled, aspect kept, so that min_pixels ≤ w×h ≤ max_pixels (unchanged if within)."""
    width, height = size
    area = width * height
    if max_pixels and area > max_pixels:
        scale = math.sqrt(max_pixels / area)
        return max(1, math.floor(width * scale)), max(1, math.floor(height * scale))
    if min_pixels and area < min_pixels:
        scale = math.sqrt(min_pixels / area)
        return max(1, math.ceil(width * scale)), max(1, math.ceil(height * scale))
    return width, height


@dataclass
class VisionModel:
    """A loaded model with what it needs to turn images (and a prompt) into inputs."""

    model: Any
    tokenizer: Any
    image_processor: Any
    processor: Any  # the multimodal processor of a decoder-only VLM; None for encoder–decoders
    encoder_decoder: bool
    processor_resizes: bool  # the image processor applies max/min_pixels itself

    def prepare(
        self, images: list[Image.Image], prompt: str | None, device: torch.device
    ) -> tuple[dict[str, Any], int]:
        """Model inputs for a batch and the length of the prefix to strip from the outputs."""
        dtype = self.model.dtype
        if self.encoder_decoder:
            pixels = self.image_processor(images=images, return_tensors="pt")["pixel_values"]
            inputs: dict[str, Any] = {"pixel_values": pixels.to(device, dtype)}
            if not prompt:
                return inputs, 1  # generate starts from decoder_start_token_id alone
            start = self.model.generation_config.decoder_start_token_id
            if start is None:
                start = self.model.config.decoder_start_token_id
            ids = [int(start), *self.tokenizer(prompt, add_special_tokens=False)["input_ids"]]
            inputs["decoder_input_ids"] = torch.tensor([ids] * len(images), device=device)
            return inputs, len(ids)
        texts = [self._chat_text(prompt)] * len(images)
        encoded = self.processor(text=texts, images=images, padding=True, return_tensors="pt")
        inputs = {}
        for key, value in encoded.items():
            if isinstance(value, torch.Tensor):
                value = value.to(device, dtype) if value.is_floating_point() else value.to(device)
            inputs[key] = value
        return inputs, int(inputs["input_ids"].shape[1])

    def _chat_text(self, prompt: str | None) -> str:
        content: list[dict[str, str]] = [{"type": "image"}]
        if prompt:
            content.append({"type": "text", "text": prompt})
        if getattr(self.processor, "chat_template", None):
            text = self.processor.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
            )
            return str(text)
        # No template: the processor's image placeholder followed by the prompt.
        return f"{getattr(self.processor, 'image_token', '<image>')}\n{prompt or ''}"


def _model_loader(model_dir: Path) -> Any:
    """The Auto class (or VisionEncoderDecoderModel) that loads this image-to-text model."""
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    if config.model_type == "vision-encoder-decoder":
        return transformers.VisionEncoderDecoderModel.from_pretrained, config
    candidates = [
        getattr(transformers, name, None)
        for name in ("AutoModelForImageTextToText", "AutoModelForVision2Seq")
    ]
    for auto in candidates:
        if auto is not None and type(config) in auto._model_mapping:
            return auto.from_pretrained, config
    raise UserError(
        f"{model_dir} holds a '{config.model_type}' model, which is not an image-to-text model — "
        "task image_to_text needs a vision-language model (e.g. Qwen2-VL, TrOCR-style encoder-decoder)",
        code="unsupported",
    )


def _accepts_pixel_limits(image_processor: Any) -> bool:
    kwargs_type = getattr(type(image_processor), "valid_kwargs", None)
    return "max_pixels" in getattr(kwargs_type, "__annotations__", {})


def _size_value(size: Any, key: str) -> Any:
    if isinstance(size, dict):
        return size.get(key)
    return getattr(size, key, None)


def _apply_pixel_limits(
    image_processor: Any, model_dir: Path, max_pixels: int | None, min_pixels: int | None
) -> tuple[Any, bool]:
    """Reload the image processor (same class) with max/min_pixels where it accepts them; returns
    it and whether it now applies the limits itself (checked on its `size`, not assumed)."""
    kwargs = {
        name: value
        for name, value in (("max_pixels", max_pixels), ("min_pixels", min_pixels))
        if value is not None
    }
    if not kwargs or not _accepts_pixel_limits(image_processor):
        return image_processor, False
    reloaded = type(image_processor).from_pretrained(model_dir, **kwargs)
    size = getattr(reloaded, "size", None)
    limits = {"longest_edge": max_pixels, "shortest_edge": min_pixels}
    applied = all(value is None or _size_value(size, key) == value for key, value in limits.items())
    return (reloaded, True) if applied else (image_processor, False)


def load_vision_model(ctx: InferContext) -> VisionModel:
    """Load model, image processor and tokenizer (or the multimodal processor) from `infer.model`."""
    import transformers

    # The Auto classes' from_pretrained carry no annotations; typed as Any on purpose.
    auto_processor: Any = transformers.AutoProcessor
    auto_image_processor: Any = transformers.AutoImageProcessor
    auto_tokenizer: Any = transformers.AutoTokenizer
    infer = ctx.infer
    loader, config = _model_loader(infer.model)
    encoder_decoder = (
        bool(getattr(config, "is_encoder_decoder", False)) or config.model_type == "vision-encoder-decoder"
    )

    processor: Any = None
    processor_error: Exception | None = None
    try:
        candidate = auto_processor.from_pretrained(infer.model)
        if hasattr(candidate, "image_processor") and hasattr(candidate, "tokenizer"):
            processor = candidate
    except (ImportError, OSError, ValueError, TypeError, KeyError) as exc:
        # e.g. Qwen2VLProcessor wants a video processor, which needs torchvision.
        processor_error = exc

    image_processor = processor.image_processor if processor is not None else None
    if image_processor is None:
        image_processor = auto_image_processor.from_pretrained(infer.model)
    image_processor, processor_resizes = _apply_pixel_limits(
        image_processor, infer.model, infer.max_pixels, infer.min_pixels
    )
    if processor is not None:
        processor.image_processor = image_processor
        tokenizer = processor.tokenizer
    else:
        tokenizer = auto_tokenizer.from_pretrained(infer.model)
    if not encoder_decoder and processor is None:
        reason = f": {str(processor_error).splitlines()[0][:300]}" if processor_error else ""
        raise UserError(
            f"{infer.model} is a decoder-only vision-language model and its multimodal processor could "
            f"not be loaded{reason} — install what it needs (often torchvision) or use a model with a "
            "complete processor",
            code="unsupported",
        )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token

    kwargs = load_kwargs(ctx)
    model, _ = load_with_attention(ctx, loader, infer.model, kwargs)
    model = place_model(ctx, model, kwargs)
    check_offload(ctx, model)
    maybe_compile(ctx, model)
    return VisionModel(model, tokenizer, image_processor, processor, encoder_decoder, processor_resizes)


@dataclass
class ImageItem:
    """One image to do: its file, its output name and (from the header) its pixel count."""

    path: Path
    output_name: str
    pixels: int


def _header_pixels(path: Path) -> int:
    """w×h from the file header (no decode); 0 when unreadable — the full load reports it."""
    try:
        with Image.open(path) as img:
            return int(img.width * img.height)
    except UNREADABLE:
        return 0


def _load_image(path: Path, infer: InferSpec, processor_resizes: bool) -> Image.Image:
    """Decode to RGB, resized into [min_pixels, max_pixels] unless the processor does that."""
    with Image.open(path) as img:
        img.load()
        rgb = img.convert("RGB")
    if not processor_resizes:
        size = fit_pixels(rgb.size, infer.max_pixels, infer.min_pixels)
        if size != rgb.size:
            rgb = rgb.resize(size, Image.Resampling.BICUBIC)
    return rgb


def run_image_to_text(ctx: InferContext, out_dir: Path) -> int:
    """The body of `task: image_to_text`; returns an exit status (OOM and stop handled here)."""
    infer = ctx.infer
    extension = ".md" if infer.output_format == "markdown" else ".json"
    images = list_images(infer.input)
    names = output_names(images, extension)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out_dir)
    with JsonlOutput(out_dir / INDEX_NAME) as index:
        rows = index.rows()
        ok_ids = {row["id"] for row in rows if row.get("status") == "ok"}
        failed_ids = {row["id"] for row in rows if row.get("status") == "failed"}
        pending: list[ImageItem] = []
        done_before = 0
        for image in images:
            target = out_dir / names[image.name]
            if target.exists():
                done_before += 1
                if image.name not in ok_ids:
                    index.write(
                        {
                            "id": image.name,
                            "image": str(image),
                            "output": target.name,
                            "status": "ok",
                            "recovered": True,
                            "attempt": ctx.attempt,
                        }
                    )
            elif image.name in failed_ids:
                done_before += 1
            else:
                pending.append(ImageItem(image, names[image.name], _header_pixels(image)))
        ctx.report.items_total = len(images)
        ctx.report.items_done_before = done_before
        ctx.samples_seen = done_before

        if not pending:
            ctx.events.emit(_started(ctx, None, done_before, out_dir))
            ctx.events.emit(Finished(report=ctx.finish_report()))
            return EXIT_OK

        from transformers import set_seed

        set_seed(infer.seed)
        load_start = time.perf_counter()
        try:
            vision = load_vision_model(ctx)
        except Exception as exc:
            code = oom_exit(ctx, exc, "load", infer.batch_size)
            if code is None:
                raise
            return code
        ctx.report.load_seconds = time.perf_counter() - load_start
        parameters = sum(p.numel() for p in vision.model.parameters())
        ctx.events.emit(_started(ctx, parameters, done_before, out_dir))
        # Largest images first: the memory peak comes at the first batch (see generate.py).
        pending.sort(key=lambda item: -item.pixels)
        return _run_all(ctx, vision, pending, index, out_dir)


def _started(ctx: InferContext, parameters: int | None, done: int, out_dir: Path) -> Started:
    return Started(
        task=ctx.infer.task,
        config=ctx.infer.model_dump(mode="json"),
        device=ctx.device_label,
        dtype=ctx.precision.used,
        parameters=parameters,
        resumed_from=str(out_dir) if done else None,
        samples_seen=done,
        tokens_seen=ctx.tokens_seen,  # counted from 0 by each attempt, unlike its items
    )


def _run_all(
    ctx: InferContext, vision: VisionModel, pending: list[ImageItem], index: JsonlOutput, out_dir: Path
) -> int:
    infer = ctx.infer
    gen_kwargs = generation_kwargs(ctx, vision.tokenizer.pad_token_id)
    eos_ids = _eos_ids(vision.model)
    for start in range(0, len(pending), infer.batch_size):
        if STOP.requested:
            print(
                "gpuwarden: stop requested; every finished image is in the output",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_TERMINATED
        batch = _open_images(ctx, vision, pending[start : start + infer.batch_size], index)
        if not batch:
            continue
        generated = _generate(ctx, vision, batch, gen_kwargs, eos_ids)
        if isinstance(generated, int):  # out of memory: the exit code that has the run retuned
            return generated
        texts, seconds, tokens_in, tokens_out = generated
        _write_outputs(ctx, batch, texts, seconds, index, out_dir)
        ctx.step += 1
        ctx.samples_seen += len(batch)
        ctx.tokens_seen += tokens_out
        ctx.report.record_batch(len(batch), seconds, tokens_in, tokens_out)
        ctx.progress(len(batch))
    ctx.events.emit(Finished(report=ctx.finish_report()))
    return EXIT_OK


def _eos_ids(model: Any) -> set[int]:
    eos = model.generation_config.eos_token_id
    return {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])} if eos is not None else set()


def _open_images(
    ctx: InferContext, vision: VisionModel, chunk: list[ImageItem], index: JsonlOutput
) -> list[tuple[ImageItem, Image.Image]]:
    """The chunk's images that open; one that does not is recorded as failed and skipped, so a
    bad file costs its own output only, not the run."""
    batch: list[tuple[ImageItem, Image.Image]] = []
    for item in chunk:
        try:
            batch.append((item, _load_image(item.path, ctx.infer, vision.processor_resizes)))
        except UNREADABLE as exc:
            message = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            ctx.warn(
                "unreadable_image",
                f"cannot read image {item.path.name} ({message}); skipped",
                used=str(item.path),
            )
            index.write(
                {
                    "id": item.path.name,
                    "image": str(item.path),
                    "status": "failed",
                    "error": message,
                    "attempt": ctx.attempt,
                }
            )
            ctx.report.record_failed()
            ctx.samples_seen += 1
    return batch


def _generate(
    ctx: InferContext,
    vision: VisionModel,
    batch: list[tuple[ImageItem, Image.Image]],
    gen_kwargs: dict[str, Any],
    eos_ids: set[int],
) -> tuple[list[tuple[str, int, str]], float, int, int] | int:
    """`_run_batch`'s result, once more without torch.compile when compiling failed; on out of
    memory the exit code instead."""
    try:
        return _run_batch(ctx, vision, batch, gen_kwargs, eos_ids)
    except Exception as exc:
        if not (ctx.infer.compile and is_compile_failure(exc)):
            code = oom_exit(ctx, exc, "generate", len(batch))
            if code is None:
                raise
            return code
        ctx.warn(
            "compile_failed",
            f"torch.compile failed ({type(exc).__name__}); continuing without compile",
            requested=True,
            used=False,
        )
    vision.model.forward = getattr(vision.model.forward, "_torchdynamo_orig_callable", vision.model.forward)
    return _run_batch(ctx, vision, batch, gen_kwargs, eos_ids)


def _write_outputs(
    ctx: InferContext,
    batch: list[tuple[ImageItem, Image.Image]],
    texts: list[tuple[str, int, str]],
    seconds: float,
    index: JsonlOutput,
    out_dir: Path,
) -> None:
    infer = ctx.infer
    for (item, image), (text, n_tokens, reason) in zip(batch, texts, strict=True):
        target = out_dir / item.output_name
        if infer.output_format == "markdown":
            write_file_atomic(target, text.rstrip() + "\n")
        else:
            record = {
                "image": item.path.name,
                "text": text,
                "prompt": infer.prompt,
                "model": str(infer.model),
                "width": image.width,
                "height": image.height,
                "tokens_out": n_tokens,
                "finish_reason": reason,
                "batch_size": len(batch),
                "latency_s": round(seconds, 6),
            }
            write_file_atomic(target, json.dumps(record, ensure_ascii=False, indent=2) + "\n")
        # The index line comes after the file is in place: a line there means the output is whole.
        index.write(
            {
                "id": item.path.name,
                "image": str(item.path),
                "output": target.name,
                "status": "ok",
                "tokens_out": n_tokens,
                "batch_size": len(batch),
                "latency_s": round(seconds, 6),
                "attempt": ctx.attempt,
            }
        )


def _run_batch(
    ctx: InferContext,
    vision: VisionModel,
    batch: list[tuple[ImageItem, Image.Image]],
    gen_kwargs: dict[str, Any],
    eos_ids: set[int],
) -> tuple[list[tuple[str, int, str]], float, int, int]:
    """Generate for one batch: (text, tokens out, finish reason) per image, seconds, tokens in
    (prompt and image tokens the model read, padding excluded) and tokens out."""
    inputs, prefix = vision.prepare([image for _, image in batch], ctx.infer.prompt, ctx.device)
    mask = inputs.get("attention_mask")
    tokens_in = int(mask.sum()) if isinstance(mask, torch.Tensor) else prefix * len(batch)
    started = timed_sync(ctx.device)
    with torch.inference_mode():
        generated = vision.model.generate(**inputs, **gen_kwargs)
    seconds = timed_sync(ctx.device) - started
    results = []
    total = 0
    for tokens in generated[:, prefix:].cpu().tolist():
        end = next((i + 1 for i, tok in enumerate(tokens) if tok in eos_ids), len(tokens))
        text = vision.tokenizer.decode(tokens[:end], skip_special_tokens=True)
        results.append((text, end, "eos" if end and tokens[end - 1] in eos_ids else "length"))
        total += end
    return results, seconds, tokens_in, total
