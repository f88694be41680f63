"""Tiny local models and inputs for the inference examples, tests and benchmark (no network).

- `build_tiny_vlm`: a TrOCR-style `VisionEncoderDecoderModel` (tiny ViT encoder, tiny GPT-2
  decoder with cross-attention), a `ViTImageProcessorPil` (no torchvision needed) and a byte-level
  BPE tokenizer trained on the same built-in corpus as `build_tiny_causal_lm`'s.
- `write_prompts`: a JSONL file of prompts with ids, of varied length.
- `write_images`: a folder of PNG and JPEG images of a few sizes.
- `build_infer_example_assets`: everything `configs/examples/infer-*-cpu.yaml` refer to.

The weights are random, so the generated text is gibberish; the models exist to exercise the
runner's machinery (batching, resume, memory, reports) in seconds on a CPU.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from gpuwarden.runners.testing_models import build_tiny_causal_lm, builtin_corpus

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")


def train_tokenizer(dir: Path, vocab: int = 512) -> Any:
    """A byte-level BPE `PreTrainedTokenizerFast` (pad/bos/eos) trained on `builtin_corpus()`,
    saved into `dir` — the recipe `build_tiny_causal_lm` uses, without the model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # its bars and blank lines would land in the CLI's output
    )
    tok.train_from_iterator(builtin_corpus(), trainer=trainer)
    fast_class: Any = PreTrainedTokenizerFast  # its constructor carries no annotations
    fast: Any = fast_class(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    Path(dir).mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(dir)
    return fast


def build_tiny_vlm(dir: Path, *, image_size: int = 32, hidden: int = 32, seed: int = 0) -> Path:
    """Save a random TrOCR-style image-to-text model with its image processor and tokenizer.

    The decoder's weights are drawn wider than the usual initialisation (std 0.5 instead of
    0.02) so that the untrained model emits varied tokens instead of one token repeated, which
    would decode to an empty string and hide bugs in output handling.
    """
    import torch
    from transformers import (
        GPT2Config,
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTImageProcessorPil,
    )

    dir = Path(dir)
    tokenizer = train_tokenizer(dir, vocab=512)
    encoder = ViTConfig(
        image_size=image_size,
        patch_size=8,
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=hidden * 2,
    )
    decoder = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=1024,
        n_embd=hidden,
        n_layer=2,
        n_head=2,
        initializer_range=0.5,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config: Any = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id = tokenizer.bos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    torch.manual_seed(seed)
    model: Any = VisionEncoderDecoderModel(config=config)
    model.generation_config.decoder_start_token_id = tokenizer.bos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(dir)
    processor: Any = ViTImageProcessorPil(size={"height": image_size, "width": image_size})
    processor.save_pretrained(dir)
    return dir


# A minimal chat template: the role, then the image placeholder and text parts in order.
_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tiny_chat_vlm(dir: Path, *, image_size: int = 32, hidden: int = 64, seed: int = 0) -> Path:
    """Save a random decoder-only VLM (LLaVA: tiny CLIP vision tower + tiny Llama) with a
    `LlavaProcessor` (`CLIPImageProcessorPil`, a chat template, an `<image>` token).

    It stands in for Qwen2-VL-style models , whose processors need torchvision: the
    runner's chat path (template, image-token expansion by the processor, left padding) is the same.
    """
    import torch
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    dir = Path(dir)
    tokenizer = train_tokenizer(dir, vocab=512)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    patch = 8
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=image_size,
        patch_size=patch,
        projection_dim=32,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=2,
        num_attention_heads=max(1, hidden // 16),
        num_key_value_heads=max(1, hidden // 16),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config: Any = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    torch.manual_seed(seed)
    model: Any = LlavaForConditionalGeneration(config)
    model.save_pretrained(dir)
    _save_chat_processor(dir, tokenizer, image_size, patch)
    return dir


def _save_chat_processor(dir: Path, tokenizer: Any, image_size: int, patch: int) -> None:
    """The `LlavaProcessor` that expands `<image>` into the vision tower's patch tokens."""
    from transformers import CLIPImageProcessorPil, LlavaProcessor

    image_processor: Any = CLIPImageProcessorPil(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    processor_class: Any = LlavaProcessor
    processor = processor_class(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch,
        vision_feature_select_strategy="default",
        chat_template=_CHAT_TEMPLATE,
        image_token="<image>",
        num_additional_image_tokens=1,  # CLIP's class token, dropped by the "default" strategy
    )
    processor.save_pretrained(dir)


_TOPICS = (
    "Explain why the batch size matters for GPU memory",
    "Summarise the checkpoint written after step",
    "Write a short note about the runner that",
    "Describe the kernel cache and the model layer",
    "List what the daemon watches when a run",
)


def write_prompts(path: Path, n: int, seed: int, *, min_words: int = 3, max_words: int = 60) -> Path:
    """Write `n` JSONL records `{"id": "p00000", "prompt": ...}` of `min_words`–`max_words` words."""
    rng = random.Random(seed)
    words = " ".join(builtin_corpus()[:50]).split()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            count = rng.randint(min_words, max_words)
            start = rng.randrange(0, len(words) - max_words)
            text = f"{rng.choice(_TOPICS)}: {' '.join(words[start : start + count])}"
            fh.write(json.dumps({"id": f"p{i:05d}", "prompt": text}) + "\n")
    return path


def write_images(dir: Path, n: int, seed: int) -> Path:
    """Write `n` smooth random images into `dir` (`page_0000.png`, …): three sizes in turn, every
    third one as JPEG, so the runner sees mixed formats and aspect ratios."""
    import numpy as np
    from PIL import Image

    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    sizes = [(64, 48), (40, 80), (96, 96)]
    for i in range(n):
        # a 4×4 grid of random colours, upsampled: cheap, and compresses like a real picture
        grid = Image.fromarray((rng.random((4, 4, 3)) * 255).astype(np.uint8))
        image = grid.resize(sizes[i % len(sizes)], Image.Resampling.BILINEAR)
        if i % 3 == 2:
            image.save(dir / f"page_{i:04d}.jpg", quality=90)
        else:
            image.save(dir / f"page_{i:04d}.png")
    return dir


def build_infer_example_assets(dir: Path) -> dict[str, Path]:
    """Build what `configs/examples/infer-*-cpu.yaml` use, under `dir`: `tiny-llm/`,
    `prompts.jsonl`, `tiny-vlm/` and `pages/` (images). Returns those paths by name."""
    dir = Path(dir)
    return {
        "tiny-llm": build_tiny_causal_lm(dir / "tiny-llm", hidden=64, layers=2, vocab=512),
        "prompts": write_prompts(dir / "prompts.jsonl", 64, seed=1),
        "tiny-vlm": build_tiny_vlm(dir / "tiny-vlm"),
        "pages": write_images(dir / "pages", 12, seed=2),
    }
