"""`task: generate` — batched text generation over a JSONL file of prompts, resumable item by item.

Items are read whole at start (ids must be unique: they are the resume key), the ones already in
the output file are skipped, and the rest are run longest-first in batches of `batch_size`
(left-padded, as decoder-only models continue from the right end). Longest-first puts the
largest memory peak at the very first batch, so a batch size that does not fit fails within
seconds instead of hours into the run, and batches of similar length waste little on padding.
Every finished item is appended to the output as one line at once.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

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
from gpuwarden.runners.infer.outputs import JsonlOutput, item_key
from gpuwarden.runners.pause_hook import pause_step, wait_for_stop
from gpuwarden.runners.stop import STOP

OUTPUT_NAME = "generations.jsonl"
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")


@dataclass
class PromptItem:
    """One line of the input: its id (given, or the 1-based line number) and prompt text."""

    id: Any
    prompt: str
    line: int


# A prompt with its token ids (truncated to max_input_length) and whether it was truncated.
Encoded = tuple[PromptItem, list[int], bool]


def output_path(output: Path | None, run_dir: Path) -> Path:
    """`output` as a file when it ends in .jsonl/.ndjson/.json, else as a folder holding
    `generations.jsonl`; by default `RUN_DIR/outputs/generations.jsonl`."""
    if output is None:
        return run_dir / "outputs" / OUTPUT_NAME
    if output.suffix.lower() in JSONL_SUFFIXES and not output.is_dir():
        return output
    return output / OUTPUT_NAME


def read_prompts(path: Path, prompt_field: str, id_field: str) -> list[PromptItem]:
    """Parse the prompts file; any malformed line is a user error naming the line and the fix."""
    if not path.is_file():
        raise UserError(
            f"input file {path} does not exist — infer.input must be a JSONL file of prompts",
            code="bad_data",
        )
    items: list[PromptItem] = []
    seen: dict[str, int] = {}
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(
                    f"{path}:{number}: not valid JSON ({exc.msg}) — one JSON object per line", code="bad_data"
                ) from None
            except RecursionError:
                raise UserError(f"{path}:{number}: JSON nested too deeply", code="bad_data") from None
            if not isinstance(obj, dict):
                raise UserError(
                    f"{path}:{number}: expected a JSON object, got {type(obj).__name__}", code="bad_data"
                )
            prompt = obj.get(prompt_field)
            if not isinstance(prompt, str):
                raise UserError(
                    f"{path}:{number}: no string field '{prompt_field}' — set infer.prompt_field to the "
                    f"field holding the prompt (this line has: {', '.join(sorted(obj)) or 'no fields'})",
                    code="bad_data",
                )
            item_id = obj.get(id_field)
            if item_id is None:
                item_id = number
            key = item_key(item_id)
            if key in seen:
                raise UserError(
                    f"{path}:{number}: id {key} already used on line {seen[key]} — ids must be unique, "
                    "they are how an interrupted run knows what is done",
                    code="bad_data",
                )
            seen[key] = number
            items.append(PromptItem(item_id, prompt, number))
    return items


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])}


def load_tokenizer(model_dir: Path) -> Any:
    """The model's tokenizer with left padding and a pad token (eos when the model has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer


def load_model(ctx: InferContext) -> Any:
    """The causal LM, placed, offload-checked and (optionally) compiled."""
    from transformers import AutoModelForCausalLM

    kwargs = load_kwargs(ctx)
    model, _ = load_with_attention(ctx, AutoModelForCausalLM.from_pretrained, ctx.infer.model, kwargs)
    model = place_model(ctx, model, kwargs)
    check_offload(ctx, model)
    maybe_compile(ctx, model)
    return model


def run_generate(ctx: InferContext, output: Path) -> int:
    """The body of `task: generate`; returns an exit status (OOM and stop handled here)."""
    infer = ctx.infer
    items = read_prompts(infer.input, infer.prompt_field, infer.id_field)
    with JsonlOutput(output) as out:
        if out.repaired_bytes:
            ctx.warn(
                "partial_output_repaired",
                f"removed a partial last line ({out.repaired_bytes} bytes) left in {output} by an "
                "interrupted attempt; that item is generated again",
            )
        pending = [item for item in items if not out.is_done(item.id)]
        done_before = len(items) - len(pending)
        ctx.report.items_total = len(items)
        ctx.report.items_done_before = done_before
        ctx.samples_seen = done_before

        if not pending:
            ctx.events.emit(_started(ctx, None, output if done_before else None, done_before))
            ctx.events.emit(Finished(report=ctx.finish_report()))
            return EXIT_OK

        from transformers import set_seed

        set_seed(infer.seed)
        load_start = time.perf_counter()
        try:
            tokenizer = load_tokenizer(infer.model)
            model = load_model(ctx)
        except Exception as exc:
            code = oom_exit(ctx, exc, "load", infer.batch_size)
            if code is None:
                raise
            return code
        ctx.report.load_seconds = time.perf_counter() - load_start
        parameters = sum(p.numel() for p in model.parameters())
        ctx.events.emit(_started(ctx, parameters, output if done_before else None, done_before))
        return _generate_all(ctx, model, tokenizer, pending, out)


def _started(ctx: InferContext, parameters: int | None, resumed: Path | None, done: int) -> Started:
    return Started(
        task=ctx.infer.task,
        config=ctx.infer.model_dump(mode="json"),
        device=ctx.device_label,
        dtype=ctx.precision.used,
        parameters=parameters,
        resumed_from=str(resumed) if resumed else None,
        samples_seen=done,
        tokens_seen=ctx.tokens_seen,  # counted from 0 by each attempt, unlike its items
    )


def _tokenize(tokenizer: Any, items: list[PromptItem], max_len: int | None) -> list[Encoded]:
    """Token ids per item (truncated to `max_len`, keeping the end of the prompt, where the
    question usually is) and whether it was truncated."""
    encoded = tokenizer([item.prompt for item in items], add_special_tokens=True)["input_ids"]
    fallback = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    result = []
    for item, ids in zip(items, encoded, strict=True):
        ids = list(ids)
        truncated = max_len is not None and len(ids) > max_len
        if truncated and max_len is not None:
            ids = ids[-max_len:]
        if not ids and fallback is not None:
            ids = [int(fallback)]  # an empty prompt still needs one position to start from
        result.append((item, ids, truncated))
    return result


@dataclass
class _BatchGenerator:
    """Runs `model.generate` for one batch of encoded prompts and turns the result into rows.

    With `compile` and a static KV cache every batch is padded to one length (`pad_to`, the
    longest prompt), so the compiled graphs (CUDA graphs on a GPU) are built once instead of once
    per distinct prompt length.
    """

    ctx: InferContext
    model: Any
    tokenizer: Any
    gen_kwargs: dict[str, Any]
    eos_ids: set[int]
    pad_to: int | None

    def run(self, batch: list[Encoded]) -> tuple[list[dict[str, Any]], float, int, int]:
        """Generate for one batch; returns the output rows, seconds, tokens in and tokens out."""
        ctx, tokenizer = self.ctx, self.tokenizer
        padding: dict[str, Any] = (
            {"padding": "max_length", "max_length": self.pad_to} if self.pad_to else {"padding": True}
        )
        padded = tokenizer.pad({"input_ids": [ids for _, ids, _ in batch]}, return_tensors="pt", **padding)
        input_ids = padded["input_ids"].to(ctx.device)
        attention_mask = padded["attention_mask"].to(ctx.device)
        started = timed_sync(ctx.device)
        with torch.inference_mode():
            generated = self.model.generate(
                input_ids=input_ids, attention_mask=attention_mask, **self.gen_kwargs
            )
        seconds = timed_sync(ctx.device) - started
        new_tokens = generated[:, input_ids.shape[1] :].cpu().tolist()
        rows: list[dict[str, Any]] = []
        tokens_in = tokens_out = 0
        for (item, ids, truncated), tokens in zip(batch, new_tokens, strict=True):
            # A finished row is padded to the batch's length after its eos: count up to the eos.
            end = next((i + 1 for i, tok in enumerate(tokens) if tok in self.eos_ids), len(tokens))
            rows.append(
                {
                    "id": item.id,
                    "prompt": item.prompt,
                    "output": tokenizer.decode(tokens[:end], skip_special_tokens=True),
                    "tokens_in": len(ids),
                    "tokens_out": end,
                    "finish_reason": "eos" if end and tokens[end - 1] in self.eos_ids else "length",
                    "truncated": truncated,
                    "batch_size": len(batch),
                    "latency_s": round(seconds, 6),
                    "attempt": ctx.attempt,
                }
            )
            tokens_in += len(ids)
            tokens_out += end
        return rows, seconds, tokens_in, tokens_out


def _generate_all(
    ctx: InferContext, model: Any, tokenizer: Any, pending: list[PromptItem], out: JsonlOutput
) -> int:
    infer = ctx.infer
    encoded = _tokenize(tokenizer, pending, infer.max_input_length)
    # Longest first (see the module docstring); ties keep file order so runs are repeatable.
    encoded.sort(key=lambda entry: -len(entry[1]))
    fixed_shapes = infer.compile and infer.kv_cache == "static"
    generator = _BatchGenerator(
        ctx,
        model,
        tokenizer,
        generation_kwargs(ctx, tokenizer.pad_token_id),
        _eos_ids(model, tokenizer),
        pad_to=len(encoded[0][1]) if fixed_shapes else None,
    )
    pause_at = pause_step(0)
    for start in range(0, len(encoded), infer.batch_size):
        if ctx.step == pause_at:
            wait_for_stop(STOP)
        if STOP.requested:
            print(
                "gpuwarden: stop requested; every finished item is in the output", file=sys.stderr, flush=True
            )
            return EXIT_TERMINATED
        batch = encoded[start : start + infer.batch_size]
        try:
            rows, seconds, tokens_in, tokens_out = generator.run(batch)
        except Exception as exc:
            if not (infer.compile and is_compile_failure(exc)):
                code = oom_exit(ctx, exc, "generate", len(batch))
                if code is None:
                    raise
                return code
            ctx.warn(
                "compile_failed",
                f"torch.compile failed ({type(exc).__name__}: {str(exc).splitlines()[0][:300]}); "
                "continuing without compile",
                requested=True,
                used=False,
            )
            model.forward = getattr(model.forward, "_torchdynamo_orig_callable", model.forward)
            rows, seconds, tokens_in, tokens_out = generator.run(batch)
        for row in rows:
            out.write(row)
        ctx.step += 1
        ctx.samples_seen += len(rows)
        ctx.tokens_seen += tokens_out
        ctx.report.record_batch(len(batch), seconds, tokens_in, tokens_out)
        ctx.progress(len(batch))
    ctx.events.emit(Finished(report=ctx.finish_report()))
    return EXIT_OK
