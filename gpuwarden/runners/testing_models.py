"""Tiny local models and data sets for tests, examples and benchmarks (no network, seconds to build).

- `build_tiny_causal_lm`: a randomly initialised Llama with a byte-level BPE tokenizer trained on
  built-in text, saved like any Hugging Face model directory.
- `write_text_dataset`: a JSONL file of `{"text": ...}` objects.
- `write_shaped_texts`: short texts, except those one rank of a gang trains on in one step.
- `write_image_folder`: PNG images (optionally with `keypoints.json` labels).
- `build_example_assets`: everything the `configs/examples/train-*-cpu.yaml` specs refer to.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np

_WORDS = [
    "the",
    "gpu",
    "memory",
    "batch",
    "model",
    "training",
    "step",
    "loss",
    "gradient",
    "optimizer",
    "sample",
    "token",
    "kernel",
    "cache",
    "layer",
    "weight",
    "tensor",
    "device",
    "power",
    "clock",
    "warden",
    "daemon",
    "runner",
    "checkpoint",
    "resume",
    "retune",
    "epoch",
    "image",
    "patch",
    "channel",
    "block",
    "residual",
    "noise",
    "clean",
    "restore",
    "keypoint",
    "shape",
    "window",
    "sequence",
    "text",
    "fast",
    "slow",
    "small",
    "large",
    "quiet",
    "busy",
    "warm",
    "cold",
    "river",
    "mountain",
    "forest",
    "city",
    "signal",
    "window",
    "garden",
    "reads",
    "writes",
    "watches",
    "keeps",
    "learns",
    "fails",
    "recovers",
    "measures",
    "samples",
    "saves",
    "loads",
    "runs",
    "stops",
]


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        out.append(" ".join(words).capitalize() + rng.choice([".", ".", "!", "?"]))
    return out


def builtin_corpus() -> list[str]:
    """Deterministic text used to train the tiny tokenizer."""
    return [" ".join(_sentences(6, seed)) for seed in range(400)]


def build_tiny_causal_lm(
    dir: Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    vocab: int = 512,
    seed: int = 0,
    max_positions: int = 2048,
) -> Path:
    """Save a random `LlamaForCausalLM` and a `PreTrainedTokenizerFast` (pad/bos/eos) into `dir`.

    The tokenizer is a byte-level BPE trained on `builtin_corpus()` up to `vocab` entries; the
    model's vocabulary is `vocab` (at least the tokenizer's size). Dropout is 0 so that runs are
    reproducible bit for bit on the CPU.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    fast = _save_tokenizer(dir, vocab)
    bos_id, eos_id = fast.bos_token_id, fast.eos_token_id

    heads = max(1, hidden // 16)
    config = LlamaConfig(
        vocab_size=max(vocab, fast.backend_tokenizer.get_vocab_size()),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        pad_token_id=fast.pad_token_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        attention_dropout=0.0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(dir)
    return dir


def _save_tokenizer(dir: Path, vocab: int) -> Any:
    """A byte-level BPE trained on `builtin_corpus()`, BOS prepended, saved as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # its bars and blank lines would land in the CLI's output
    )
    tok.train_from_iterator(builtin_corpus(), trainer=trainer)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos_id)])
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(dir)
    return fast


def write_text_dataset(path: Path, n: int, seed: int, *, field: str = "text") -> Path:
    """Write `n` JSONL records `{field: text}` of 1–6 sentences each."""
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            text = " ".join(_sentences(rng.randint(1, 6), seed * 100_003 + i))
            fh.write(json.dumps({field: text}) + "\n")
    return path


def write_shaped_texts(
    path: Path, *, n: int, seed: int, per_rank: int, world_size: int, long_step: int, long_rank: int
) -> Path:
    """`n` texts of a few words, except the samples that rank `long_rank` trains on in optimizer
    step `long_step` (1-based, first epoch, data seed `seed`): those have 400 words, so only that
    rank meets a large shape, once."""
    from gpuwarden.runners.train.sampling import epoch_permutation, rank_positions

    step_size = per_rank * world_size
    start = (long_step - 1) * step_size
    positions = rank_positions(start, start + step_size, long_rank, world_size, per_rank)
    order = epoch_permutation(n, seed, 0)
    long_items = {int(order[p]) for p in positions}
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            count = 400 if i in long_items else rng.randint(3, 6)
            fh.write(json.dumps({"text": " ".join(rng.choice(_WORDS) for _ in range(count))}) + "\n")
    return path


def write_image_folder(
    dir: Path,
    n: int,
    size: int | tuple[int, int],
    seed: int,
    *,
    keypoints: int | None = None,
    channels: int = 3,
) -> Path:
    """Write `n` smooth random PNG images of `size` (w, h) into `dir`.

    With `keypoints`, each image gets that many bright blobs and `keypoints.json` maps file names
    to their centres as `[x, y]` in [0, 1] (the format the image task reads).
    """
    from PIL import Image

    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    width, height = (size, size) if isinstance(size, int) else size
    rng = np.random.default_rng(seed)
    labels: dict[str, list[list[float]]] = {}
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    for i in range(n):
        base = rng.random((4, 4, channels)).astype(np.float32)
        # smooth background: a 4×4 grid of colours, upsampled by PIL (bilinear)
        small = Image.fromarray((base * 255).astype(np.uint8).squeeze())
        img = np.asarray(small.resize((width, height), Image.Resampling.BILINEAR), dtype=np.float32) / 255.0
        if img.ndim == 2:
            img = img[:, :, None]
        img = img * 0.5
        if keypoints:
            points = rng.random((keypoints, 2)).astype(np.float32) * 0.8 + 0.1
            sigma = max(1.5, min(width, height) / 24)
            for x, y in points:
                blob = np.exp(-((xs - x * width) ** 2 + (ys - y * height) ** 2) / (2 * sigma**2))
                img = img + 0.5 * blob[:, :, None]
            labels[f"img_{i:05d}.png"] = [[float(x), float(y)] for x, y in points]
        pixels = (np.clip(img, 0, 1) * 255).astype(np.uint8)
        Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels).save(dir / f"img_{i:05d}.png")
    if keypoints:
        (dir / "keypoints.json").write_text(json.dumps(labels), encoding="utf-8")
    return dir


def write_ramp_texts(path: Path, short: int, long: int, seed: int, *, long_sentences: int = 120) -> Path:
    """`short` one-sentence texts, then `long` texts of `long_sentences` sentences: a training
    run over them in order uses little memory at first and much more later, as real data with a
    few long documents does (the users'-own-script examples run out of memory mid-way on it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(short + long):
            n = 1 if i < short else long_sentences
            fh.write(json.dumps({"text": " ".join(_sentences(n, seed * 100_003 + i))}) + "\n")
    return path


def build_example_assets(dir: Path) -> dict[str, Path]:
    """Build what `configs/examples/train-*-cpu.yaml` use, under `dir` (by convention
    `.example-models` at the repository root, shared with the inference examples):
    `train-lm/` (tiny Llama + tokenizer), `train-texts.jsonl`, `train-images/` (restoration),
    `train-keypoints/` (with keypoints.json), and for `ddp-oom-recovery-cpu.yaml` `gang-lm/` (a
    32 000-word vocabulary: long texts cost a lot of logits) with `gang-texts.jsonl` (short texts,
    except the eight that rank 1 of 2 trains on in step 4 at micro-batch 8). Returns those paths
    by name."""
    dir = Path(dir)
    return {
        "gang-lm": build_tiny_causal_lm(dir / "gang-lm", hidden=64, layers=1, vocab=32000),
        "gang-texts": write_shaped_texts(
            dir / "gang-texts.jsonl", n=96, seed=3, per_rank=8, world_size=2, long_step=4, long_rank=1
        ),
        "train-lm": build_tiny_causal_lm(dir / "train-lm", hidden=64, layers=2, vocab=512),
        "train-texts": write_text_dataset(dir / "train-texts.jsonl", 256, seed=1),
        "ramp-texts": write_ramp_texts(dir / "ramp-texts.jsonl", short=48, long=32, seed=4),
        "train-images": write_image_folder(dir / "train-images", 32, 96, seed=2),
        "train-keypoints": write_image_folder(dir / "train-keypoints", 32, 64, seed=3, keypoints=4),
    }
