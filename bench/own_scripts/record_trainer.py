"""Run a Hugging Face Trainer script unchanged, recording each start of its training loop.

    python bench/own_scripts/record_trainer.py STARTS.jsonl SCRIPT ARGS…

`auto_find_batch_size` restarts the Trainer's inner loop in the same process at a smaller batch;
a callback added to the Trainer's default callbacks appends each start's batch size,
accumulation and wall-clock time to STARTS.jsonl, so the benchmark counts attempts without
reading logs and times the script's start-up (its launch to its training loop's first start). The script
itself runs as `__main__`, as it would from the command line.
"""

from __future__ import annotations

import json
import runpy
import sys
import time
from typing import Any

import transformers.trainer
from transformers import TrainerCallback


class RecordStarts(TrainerCallback):
    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        start = {
            "batch_size": state.train_batch_size,
            "accum": args.gradient_accumulation_steps,
            "ts": time.time(),
        }
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(start) + "\n")


def main() -> None:
    starts, script, *args = sys.argv[1:]
    # The list holds classes or instances; its annotation says classes only.
    transformers.trainer.DEFAULT_CALLBACKS.append(RecordStarts(starts))  # type: ignore[arg-type]
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
