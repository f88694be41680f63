"""Fine-tune a causal LM with a training loop of your own on Accelerate, in the shape of
transformers' `run_clm_no_trainer.py`: argparse flags, `accelerator.accumulate`,
`accelerator.save_state` every `--checkpointing_steps` into `OUTPUT_DIR/step_N`, and
`--resume_from_checkpoint` handed to `accelerator.load_state`.

    gpuwarden example-models                       # the tiny local LM and texts (no download)
    accelerate launch examples/accelerate/train.py --model_name_or_path .example-models/train-lm \\
        --train_file .example-models/ramp-texts.jsonl --per_device_train_batch_size 16 \\
        --output_dir out --checkpointing_steps 1

Each text is one example, padded to the longest of its batch as `run_glue_no_trainer.py` pads;
the texts grow longer halfway through the file, so a micro-batch that fits the first steps can
run out of memory later, after the first checkpoints. Unlike `run_clm_no_trainer.py` it resets
Accelerate's micro-batch counter after `load_state`, so a restart with another accumulation
resumes exactly (see `resume_point`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, get_scheduler


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Fine-tune a causal LM with Accelerate, no Trainer")
    p.add_argument("--model_name_or_path", required=True, help="a model directory (save_pretrained)")
    p.add_argument("--train_file", required=True, help='JSONL file of {"text": ...} records')
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--num_train_epochs", type=int, default=1)
    p.add_argument("--max_train_steps", type=int, default=None, help="overrides --num_train_epochs")
    p.add_argument("--block_size", type=int, default=1024, help="tokens per text at most")
    p.add_argument("--output_dir", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpointing_steps", default=None, help="a number of steps, or 'epoch'")
    p.add_argument("--resume_from_checkpoint", default=None, help="a folder save_state wrote")
    return p.parse_args()


def texts(path: str, tokenizer: Any, block_size: int) -> list[dict[str, Any]]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [
        tokenizer(json.loads(line)["text"], truncation=True, max_length=block_size) for line in lines if line
    ]


def resume_point(args: argparse.Namespace, accelerator: Accelerator, batches: int) -> tuple[int, int]:
    """(first epoch, micro-batches to skip in it), from the checkpoint's name as run_clm_no_trainer
    reads it: `step_N` counts optimizer steps, so a restart with another micro-batch and
    accumulation skips the same number of samples."""
    accelerator.print(f"Resumed from checkpoint: {args.resume_from_checkpoint}")
    accelerator.load_state(args.resume_from_checkpoint)
    # load_state restores the micro-batch counter that decides where an accumulation window ends,
    # counted with the accumulation the checkpoint was written with; checkpoints are written at a
    # window's end, so the next micro-batch starts a window whatever the accumulation is now.
    accelerator.step = 0
    name = os.path.basename(os.path.normpath(args.resume_from_checkpoint))
    if name.startswith("epoch_"):
        return int(name.removeprefix("epoch_")) + 1, 0
    skip = int(name.removeprefix("step_")) * args.gradient_accumulation_steps
    return skip // batches, skip % batches


def save(accelerator: Accelerator, args: argparse.Namespace, name: str) -> None:
    accelerator.save_state(os.path.join(args.output_dir, name) if args.output_dir else name)


def main() -> None:
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
    loader = torch.utils.data.DataLoader(
        texts(args.train_file, tokenizer, args.block_size),  # type: ignore[arg-type]
        batch_size=args.per_device_train_batch_size,
        collate_fn=DataCollatorForLanguageModeling(tokenizer, mlm=False),
    )
    steps_per_epoch = math.ceil(len(loader) / args.gradient_accumulation_steps)
    max_steps = args.max_train_steps or args.num_train_epochs * steps_per_epoch
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0, num_training_steps=max_steps)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    every = int(args.checkpointing_steps) if (args.checkpointing_steps or "").isdigit() else None
    first_epoch, skip = (
        resume_point(args, accelerator, len(loader)) if args.resume_from_checkpoint else (0, 0)
    )
    completed = first_epoch * steps_per_epoch + skip // args.gradient_accumulation_steps
    for epoch in range(first_epoch, math.ceil(max_steps / steps_per_epoch)):
        model.train()
        batches = accelerator.skip_first_batches(loader, skip) if epoch == first_epoch and skip else loader
        for batch in batches:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed += 1
                accelerator.print(f"step {completed} loss {loss.item():.4f}")
                if every and completed % every == 0:
                    save(accelerator, args, f"step_{completed}")
            if completed >= max_steps:
                break
        if args.checkpointing_steps == "epoch":
            save(accelerator, args, f"epoch_{epoch}")
    if args.output_dir is not None:
        accelerator.wait_for_everyone()
        accelerator.unwrap_model(model).save_pretrained(
            args.output_dir, is_main_process=accelerator.is_main_process
        )


if __name__ == "__main__":
    main()
