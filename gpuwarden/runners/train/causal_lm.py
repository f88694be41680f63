"""Causal language-model fine-tuning of a local transformers model on a JSON/JSONL file of texts.

Data: a JSON list or a JSONL file whose items are strings or objects with `text_field`. Texts are
tokenised once at start-up (with the model's tokenizer, BOS added by its template):
- `packing: false`: one text per sample, truncated to `max_length`; a micro-batch is padded on
  the right to its longest sample rounded up to a multiple of 8 (tensor-core friendly shapes,
  never beyond `max_length`); labels are -100 on padding.
- `packing: true`: all texts joined with EOS and cut into full `max_length` blocks (the
  remainder is dropped); no padding at all.

The loss is the summed next-token cross-entropy over label tokens; the loop divides by the label
tokens of the whole optimizer step, so accumulation equals the full batch's token mean.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from gpuwarden.core.config.spec_train import TrainSpec
from gpuwarden.core.errors import UserError
from gpuwarden.runners.train.sampling import SampleKey
from gpuwarden.runners.train.task import Batch, PreparedTask

if TYPE_CHECKING:
    from transformers import PreTrainedModel

IGNORE_INDEX = -100


def load_texts(path: Path, text_field: str) -> list[str]:
    """Texts from a JSON list or JSONL file; UserError (bad_data) naming the file and line."""
    if not path.is_file():
        raise UserError(f"data file {path} does not exist — check train.data", code="bad_data")
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read data file {path}: {exc}", code="bad_data") from None
    if raw.lstrip().startswith("["):
        items, where = _json_list_items(raw, path), "item"
    else:
        items, where = _jsonl_items(raw, path), "line"
    texts = [_text_of(item, text_field, f"{path} {where} {pos}") for pos, item in items]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise UserError(f"{path} holds no non-empty texts", code="bad_data")
    return texts


def _json_list_items(raw: str, path: Path) -> list[tuple[int, Any]]:
    """(1-based item number, item) of a JSON list."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise UserError(f"{path} is not valid JSON: {exc}", code="bad_data") from None
    return [(i + 1, item) for i, item in enumerate(data)]


def _jsonl_items(raw: str, path: Path) -> list[tuple[int, Any]]:
    """(line number, item) of each non-blank JSONL line, numbered as an editor shows them."""
    items: list[tuple[int, Any]] = []
    for lineno, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            items.append((lineno, json.loads(line)))
        except (ValueError, RecursionError) as exc:
            raise UserError(f"{path}:{lineno}: not a JSON line ({exc})", code="bad_data") from None
    return items


def _text_of(item: Any, text_field: str, where: str) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and isinstance(item.get(text_field), str):
        return str(item[text_field])
    raise UserError(
        f"{where}: expected a string or an object with a string '{text_field}' field "
        "— fix the data or set train.text_field",
        code="bad_data",
    )


class TokenDataset(Dataset[list[int]]):
    """Pre-tokenised samples addressed by `(epoch, index)` keys (the epoch does not matter here)."""

    def __init__(self, samples: list[list[int]]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key: SampleKey) -> list[int]:
        return self.samples[key[1]]


class PadCollate:
    """Right-pads a micro-batch to its longest sample (rounded up to 8, capped at max_length)."""

    def __init__(self, pad_id: int, max_length: int) -> None:
        self.pad_id = pad_id
        self.max_length = max_length

    def __call__(self, samples: list[list[int]]) -> Batch:
        longest = max(len(s) for s in samples)
        width = min(-(-longest // 8) * 8, max(self.max_length, longest))
        ids = torch.full((len(samples), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(samples), width), dtype=torch.long)
        for row, sample in enumerate(samples):
            ids[row, : len(sample)] = torch.tensor(sample, dtype=torch.long)
            mask[row, : len(sample)] = 1
        labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
        units = int((labels[:, 1:] != IGNORE_INDEX).sum())
        tokens = int(mask.sum())
        return Batch(
            {"input_ids": ids, "attention_mask": mask, "labels": labels}, len(samples), units, tokens
        )


def causal_lm_loss_sum(model: nn.Module, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """Summed next-token cross-entropy over the label tokens of the micro-batch (fp32 logits)."""
    out = model(input_ids=tensors["input_ids"], attention_mask=tensors["attention_mask"])
    logits = out.logits[:, :-1, :].float()
    labels = tensors["labels"][:, 1:]
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )


def _check_model_dir(path: Path, what: str) -> None:
    if not path.is_dir():
        raise UserError(f"{what} directory {path} does not exist — check train.{what}", code="missing_model")
    if what == "model" and not (path / "config.json").is_file():
        raise UserError(
            f"{path} has no config.json — train.model must be a local transformers model directory",
            code="missing_model",
        )


def prepare_causal_lm(spec: TrainSpec) -> PreparedTask:
    """Load the model, tokenizer and data named by `spec` (fp32 weights, on the CPU)."""
    assert spec.model is not None and spec.data is not None  # enforced by TrainSpec validation
    _check_model_dir(spec.model, "model")
    tokenizer_dir = spec.tokenizer or spec.model
    _check_model_dir(tokenizer_dir, "tokenizer")
    texts = load_texts(spec.data, spec.text_field)

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    tokenizer, pad_id = _load_tokenizer(tokenizer_dir, spec.packing)
    encoded: list[list[int]] = tokenizer(texts, add_special_tokens=True)["input_ids"]
    if spec.packing:
        samples = _packed_samples(encoded, tokenizer.eos_token_id, spec.max_length, spec.data)
    else:
        samples = [ids[: spec.max_length] for ids in encoded if len(ids) >= 2]
        if not samples:
            raise UserError(f"every text in {spec.data} is shorter than 2 tokens", code="bad_data")
    model = _load_model(spec.model)

    def enable_checkpointing() -> None:
        model.gradient_checkpointing_enable(  # type: ignore[no-untyped-call]
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )

    def export(trained: nn.Module, out_dir: Path) -> None:
        trained.save_pretrained(out_dir)  # type: ignore[operator]
        tokenizer.save_pretrained(out_dir)

    return PreparedTask(
        name="causal_lm",
        model=model,
        dataset=TokenDataset(samples),
        num_samples=len(samples),
        collate=PadCollate(int(pad_id if pad_id is not None else 0), spec.max_length),
        loss_sum=causal_lm_loss_sum,
        image_like=False,
        enable_gradient_checkpointing=enable_checkpointing,
        export=export,
        summary={"texts": len(texts), "samples": len(samples), "packing": spec.packing},
    )


def _load_tokenizer(tokenizer_dir: Path, packing: bool) -> tuple[Any, int | None]:
    """The tokenizer and the id that pads (its pad token, else EOS; packing needs neither)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    except (OSError, ValueError) as exc:
        raise UserError(
            f"cannot load a tokenizer from {tokenizer_dir}: {exc}", code="missing_model"
        ) from None
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None and not packing:
        raise UserError(
            f"the tokenizer in {tokenizer_dir} has neither a pad nor an EOS token — "
            "add one or use packing: true",
            code="missing_model",
        )
    return tokenizer, pad_id


def _packed_samples(
    encoded: list[list[int]], eos: int | None, max_length: int, data: Path
) -> list[list[int]]:
    stream: list[int] = []
    for ids in encoded:
        stream.extend(ids)
        if eos is not None:
            stream.append(eos)
    samples = [stream[i : i + max_length] for i in range(0, len(stream) - max_length + 1, max_length)]
    if not samples:
        raise UserError(
            f"{data} has {len(stream)} tokens, fewer than one packed block of max_length "
            f"{max_length} — lower max_length or set packing: false",
            code="bad_data",
        )
    return samples


def _load_model(model_dir: Path) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot load a causal LM from {model_dir}: {exc}", code="missing_model") from None
    model.config.use_cache = False  # the KV cache is useless in training and costs memory
    return model
