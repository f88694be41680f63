"""One probe process that measures several micro-batches of a training or inference run:

    python -m gpuwarden.runners.probe_session

It imports torch and builds the model and data once (the costly part of a probe: seconds to tens
of seconds), then reads requests from stdin, one JSON object a line:

    {"spec": "SIZE_DIR/probe.yaml", "run_dir": "SIZE_DIR", "events": "SIZE_DIR/events.jsonl"}

and runs each exactly as `python -m gpuwarden.runners --spec … --run-dir … --events …` would
(resuming the size's own copy of the checkpoint, its steps, its events), answering one line on
stdout when it is done: `{"status": EXIT}`. The asker decides the next size from the answers.

Each size runs in a fork of the loaded process. Its peaks are then its own, in any order: the
fork's memory and its high-water marks (VmPeak, what an address-space limit counts, cannot be
reset in a process that ran an earlier size) start where a fresh runner's stood once it had
built the same model, and what a size allocates goes with its fork. A size that runs out of
memory (the limit applies to each fork) ends only its fork. The parent never touches CUDA: a
CUDA context does not survive a fork, so each size's fork opens its own, as a fresh runner does.

An inference run's sizes share the imports (torch, transformers: most of a probe's start) but
each fork loads the model itself: loading it places it (a device map, offload, 8-bit), which would
open CUDA in this process.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
from pathlib import Path
from typing import IO, Any

from gpuwarden.core.config.spec import RunSpec, load_spec
from gpuwarden.core.errors import UserError, one_line
from gpuwarden.core.events import EXIT_OK, EXIT_USER_ERROR
from gpuwarden.runners.events import EventWriter
from gpuwarden.runners.stop import STOP

# What builds the model and data: sizes that agree on these share one built task.
_TASK_FIELDS = {
    "task",
    "model",
    "tokenizer",
    "data",
    "text_field",
    "max_length",
    "packing",
    "image",
    "seed",
    "gradient_checkpointing",
}


class TaskCache:
    """The prepared task of the last spec, handed out again while the task's fields agree."""

    def __init__(self) -> None:
        self._key: str | None = None
        self._task: Any = None

    def __call__(self, spec: RunSpec) -> Any:
        if spec.infer is not None:
            _import_inference(spec)
            return None
        from gpuwarden.runners.train.main import prepare_task

        assert spec.train is not None
        key = spec.train.model_dump_json(include=_TASK_FIELDS)
        if key != self._key:
            self._task = None  # the old model's memory goes before the new one is built
            gc.collect()
            self._task = prepare_task(spec)
            self._key = key
        return self._task


def _import_inference(spec: RunSpec) -> None:
    """What every size of an inference run imports, once for all of them (nothing touches CUDA)."""
    from gpuwarden.runners.infer.common import quiet_transformers

    quiet_transformers()
    task = "generate" if spec.infer is not None and spec.infer.task == "generate" else "image_to_text"
    importlib.import_module(f"gpuwarden.runners.infer.{task}")  # torch, transformers


def _request(line: str) -> tuple[Path, Path, Path]:
    try:
        doc = json.loads(line)
        return Path(doc["spec"]), Path(doc["run_dir"]), Path(doc["events"])
    except (ValueError, KeyError, TypeError) as exc:
        why = f"probe session: a request must be JSON with spec, run_dir and events ({exc})"
        raise UserError(why) from None


def _load(spec_path: Path, tasks: TaskCache) -> RunSpec:
    """The size's spec, its model and data built (once for every size of the same task)."""
    spec = load_spec(spec_path)
    if spec.train is None and spec.infer is None:
        raise UserError("a probe session measures training and inference runs only", code="unsupported")
    tasks(spec)
    return spec


def _run_size(spec: RunSpec, run_dir: Path, events: EventWriter, tasks: TaskCache) -> int:
    """In the fork: the size's attempt, every failure an event, as the runner's entry point does."""
    from gpuwarden.runners.__main__ import report_failure

    try:
        if spec.infer is not None:
            from gpuwarden.runners.infer.main import run as run_inference

            return run_inference(spec, run_dir, 1, events)
        from gpuwarden.runners.train.main import run

        return run(spec, run_dir, 1, events, prepare=tasks)
    except (KeyboardInterrupt, SystemExit):
        return EXIT_USER_ERROR
    except BaseException as exc:  # every failure must become an event
        return report_failure(exc, events)


def measure(line: str, tasks: TaskCache) -> tuple[int, bool]:
    """Run one size's request to its end: (its exit status, whether this process can go on)."""
    from gpuwarden.runners.__main__ import report_failure

    spec_path, run_dir, events_path = _request(line)
    with EventWriter(events_path) as events:
        try:
            spec = _load(spec_path, tasks)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # building the model failed (out of memory, say): no fork
            return report_failure(exc, events), False
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the fork: run the size and leave without the parent's teardown
            status = _run_size(spec, run_dir, events, tasks)
            events.close()
            sys.stderr.flush()
            os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(wait_status), True


def serve(requests: IO[str], replies: IO[str]) -> int:
    """Answer requests until stdin ends (0) or this process itself fails (its status)."""
    tasks = TaskCache()
    for line in requests:
        if not line.strip():
            continue
        try:
            status, usable = measure(line, tasks)
        except UserError as exc:
            print(f"gpuwarden: {one_line(exc.message)}", file=sys.stderr, flush=True)
            status, usable = EXIT_USER_ERROR, True
        replies.write(json.dumps({"status": status}) + "\n")
        replies.flush()
        if not usable or STOP.requested:
            return status
    return EXIT_OK


def main() -> int:
    # torch.cuda.is_available() (libraries building a model ask it) otherwise asks the CUDA runtime,
    # which initialises the driver in this process, and a driver initialised before a fork fails
    # in the fork ("initialization error"). Asked through NVML instead, nothing of CUDA starts here.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    STOP.install()
    # Answers go to the real stdout; whatever the model's libraries print goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    with replies:
        return serve(sys.stdin, replies)


if __name__ == "__main__":
    sys.exit(main())
