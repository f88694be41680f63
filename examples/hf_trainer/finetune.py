"""Fine-tune a causal LM with the Hugging Face Trainer: TrainingArguments as command-line flags.

    gpuwarden example-models                      # the tiny local LM and texts (no download)
    python examples/hf_trainer/finetune.py --model .example-models/train-lm \\
        --data .example-models/ramp-texts.jsonl --output_dir out --per_device_train_batch_size 16

Any TrainingArguments flag works (`--gradient_accumulation_steps`, `--resume_from_checkpoint`,
`--save_steps` …); `--eval_data` with `--eval_strategy steps` evaluates as it trains.
`--gpuwarden_callback` adds gpuwarden's TrainerCallback (progress with
memory, checkpoint events, an OOM turned into checkpoint + `oom` event + exit 3); without it
gpuwarden still recovers the run from stderr, the exit status and output_dir/checkpoint-*.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
)


@dataclass
class ScriptArguments:
    model: str = field(metadata={"help": "a model directory (save_pretrained)"})
    data: str = field(metadata={"help": 'JSONL file of {"text": ...} records'})
    eval_data: str | None = field(
        default=None, metadata={"help": "JSONL texts to evaluate on (with --eval_strategy steps or epoch)"}
    )
    max_length: int = field(default=1024, metadata={"help": "tokens per text at most"})
    attn_implementation: str = field(default="eager", metadata={"help": "eager | sdpa"})
    gpuwarden_callback: bool = field(default=False, metadata={"help": "add gpuwarden's TrainerCallback"})


class Texts(torch.utils.data.Dataset[dict[str, Any]]):
    def __init__(self, path: str, tokenizer: Any, max_length: int) -> None:
        texts = [json.loads(line)["text"] for line in Path(path).read_text().splitlines() if line.strip()]
        self.items = [tokenizer(t, truncation=True, max_length=max_length) for t in texts]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return dict(self.items[i])


def main() -> None:
    script, args = HfArgumentParser((ScriptArguments, TrainingArguments)).parse_args_into_dataclasses()
    tokenizer = AutoTokenizer.from_pretrained(script.model)
    model = AutoModelForCausalLM.from_pretrained(script.model, attn_implementation=script.attn_implementation)
    callbacks = []
    if script.gpuwarden_callback:
        from gpuwarden.sdk.transformers import GpuwardenCallback

        callbacks.append(GpuwardenCallback())
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Texts(script.data, tokenizer, script.max_length),
        eval_dataset=Texts(script.eval_data, tokenizer, script.max_length) if script.eval_data else None,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.save_model()


if __name__ == "__main__":
    main()
