"""The Hugging Face example's model and data in a thin LightningModule, for the own-scripts
benchmark: the same tiny causal LM, the same texts in the same order, AdamW with a linear decay
and gradient clipping at 1.0 as the Trainer does.

    python bench/own_scripts/lightning_lm.py --model M --data D --out DIR [--find-batch-size]

`--find-batch-size` runs Lightning's `Tuner.scale_batch_size` (power mode, its defaults) before
the fit, as a user who wants Lightning to pick the batch would. Every training start (each of
the finder's trials and the fit) is appended to DIR/starts.jsonl with its batch size, so the
benchmark counts attempts without parsing logs. The final weights go to DIR/final.safetensors.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.tuner.tuning import Tuner
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling


class Texts(L.LightningDataModule):
    def __init__(self, path: str, tokenizer: Any, batch_size: int, max_length: int = 1024) -> None:
        super().__init__()
        self.batch_size = batch_size
        texts = [json.loads(line)["text"] for line in Path(path).read_text().splitlines() if line.strip()]
        self.items = [dict(tokenizer(t, truncation=True, max_length=max_length)) for t in texts]
        self.collate = DataCollatorForLanguageModeling(tokenizer, mlm=False)

    def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        return torch.utils.data.DataLoader(
            self.items,  # type: ignore[arg-type]
            batch_size=self.batch_size,
            shuffle=False,
            collate_fn=self.collate,
        )


class CausalLM(L.LightningModule):
    def __init__(self, model_dir: str, lr: float, max_steps: int, starts: Path) -> None:
        super().__init__()
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
        self.lr, self.max_steps, self.starts = lr, max_steps, starts

    def on_train_start(self) -> None:
        loader = self.trainer.train_dataloader
        batch = getattr(loader, "batch_size", None)
        with open(self.starts, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"batch_size": batch, "accum": self.trainer.accumulate_grad_batches}) + "\n")

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss: torch.Tensor = self.model(**batch).loss
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.0)
        decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / self.max_steps))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": decay, "interval": "step"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--max_steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--find-batch-size", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    L.seed_everything(42, verbose=False)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = CausalLM(args.model, args.lr, args.max_steps, args.out / "starts.jsonl")
    data = Texts(args.data, tokenizer, args.batch_size)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.max_steps,
        gradient_clip_val=1.0,
        default_root_dir=str(args.out),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    if args.find_batch_size:
        tuner = Tuner(trainer)
        found = tuner.scale_batch_size(model, datamodule=data, mode="power", init_val=args.batch_size)
        print(f"finder picked batch size {found}", flush=True)
    trainer.fit(model, datamodule=data)
    weights = {k: v.contiguous() for k, v in model.model.state_dict().items()}
    save_file(weights, str(args.out / "final.safetensors"))
    print(f"done: {trainer.global_step} steps at batch size {data.batch_size}", flush=True)


if __name__ == "__main__":
    main()
