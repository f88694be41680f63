"""The runner → daemon event protocol (version 1), documented in docs/events.md.

A runner appends one JSON object per line to its attempt's `events.jsonl`, flushing after each
line. Every line carries the envelope `{"v": 1, "type": ..., "ts": <unix seconds>}` plus the
fields of its type. Readers must tolerate a partial last line (the runner may be mid-write) and
skip lines that do not parse (counted, never fatal), and must ignore unknown fields and unknown
types so old daemons can read newer runners.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuwarden.core.errors import UserError
from gpuwarden.core.safeload import EVENT_LIMITS, load_json

PROTOCOL_VERSION = 1

# Exit codes a gpuwarden runner uses; the daemon classifies attempts by them and by events.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USER_ERROR = 2  # the spec cannot be satisfied: retrying will not help
EXIT_OOM = 3  # an `oom` event was written (after a checkpoint when the state was consistent)
EXIT_GANG_ABORTED = 4  # another rank of a multi-process run failed; this rank stopped without a checkpoint
EXIT_TERMINATED = 143  # stopped by SIGTERM after writing a checkpoint

# The daemon's own warning when an ended attempt left processes running outside its process group
# (killed); `show` says it beside the run's warnings.
LEFT_RUNNING_CODE = "left_running"

EventType = Literal[
    "started", "fixed_memory", "progress", "checkpoint", "warning", "oom", "error", "finished"
]


class Event(BaseModel):
    """Envelope shared by every event; subclasses add their fields."""

    model_config = ConfigDict(extra="allow")

    v: int = PROTOCOL_VERSION
    type: str
    ts: float = Field(default_factory=time.time)
    rank: int | None = None  # the writing process's rank in a multi-process run; absent otherwise


class Started(Event):
    type: Literal["started"] = "started"
    task: str
    config: dict[str, Any]  # the resolved spec section actually used
    device: str  # "cuda:0", "cpu"
    dtype: str  # precision actually used: "bf16", "fp16", "fp32"
    parameters: int | None = None
    resumed_from: str | None = None  # checkpoint path, or None for a fresh start
    samples_seen: int = 0
    # tokens the attempt counts on from (a checkpoint's; 0 where its count starts afresh)
    tokens_seen: int | None = None
    pid: int | None = None  # the runner process (one per rank in a multi-process run)
    world_size: int | None = None  # processes of a multi-process run; absent for one process


class FixedMemory(Event):
    """What the run holds whatever its micro-batch, once model and optimizer are built (and a
    checkpoint loaded): a lower bound of the memory line's fixed part (gpuwarden.sdk.fixed_memory)."""

    type: Literal["fixed_memory"] = "fixed_memory"
    fixed_bytes: int  # held now + gradients and optimizer state to come
    held_bytes: int  # CUDA: the allocator's allocated bytes; cpu: the address space
    gradient_bytes: int
    optimizer_state_bytes: int
    parameters: int
    device: Literal["cuda", "cpu"]


class Progress(Event):
    type: Literal["progress"] = "progress"
    step: int  # optimizer steps (training) or batches (inference)
    samples_seen: int
    tokens_seen: int | None = None
    loss: float | None = None
    lr: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    batch_size: int | None = None
    mem_allocated: int | None = None  # bytes
    mem_reserved: int | None = None
    mem_peak: int | None = None
    num_alloc_retries: int | None = None
    vm_peak: int | None = None  # CPU runs: peak address space (what RLIMIT_AS counts)
    total: int | None = None  # samples (or items) in the whole run, for progress bars and ETA


class Checkpoint(Event):
    type: Literal["checkpoint"] = "checkpoint"
    path: str
    step: int
    samples_seen: int
    reason: Literal["interval", "sigterm", "oom", "final"] = "interval"


class Warning(Event):  # the protocol calls it "warning"; shadows the builtin only in this module
    type: Literal["warning"] = "warning"
    code: str  # e.g. "offloaded_to_cpu", "precision_unavailable", "fused_adamw_unavailable"
    message: str
    requested: Any = None
    used: Any = None


class Oom(Event):
    type: Literal["oom"] = "oom"
    verdict: str  # gpu_capacity | gpu_fragmentation | gpu_contention | host_oom | shape_bug
    message: str  # the allocator's text, first line(s)
    fields: dict[str, Any] = Field(default_factory=dict)  # parsed allocator numbers (bytes)
    phase: str | None = None  # "forward", "backward", "optimizer", "eval", "generate", "load"
    batch_size: int | None = None
    step: int | None = None
    checkpoint: str | None = None  # the checkpoint written at the OOM, if the state was consistent


class Error(Event):
    type: Literal["error"] = "error"
    code: str  # "missing_model", "bad_data", "unsupported", "bug", "gang_aborted"
    message: str  # one line: the problem and the fix


class Finished(Event):
    type: Literal["finished"] = "finished"
    report: dict[str, Any]


EVENT_TYPES: dict[str, type[Event]] = {
    "started": Started,
    "fixed_memory": FixedMemory,
    "progress": Progress,
    "checkpoint": Checkpoint,
    "warning": Warning,
    "oom": Oom,
    "error": Error,
    "finished": Finished,
}


def encode(event: Event) -> str:
    """One line of JSON (no newline) for `event`."""
    return json.dumps(event.model_dump(mode="json", exclude_none=True), separators=(",", ":"))


def decode(line: str) -> dict[str, Any] | None:
    """Parse one line into a dict with at least `type` and `ts`; None for anything unusable."""
    try:
        obj = load_json(line, "event", EVENT_LIMITS)
    except UserError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        return None
    if not _finite_number(obj.get("ts")):
        obj["ts"] = time.time()
    return obj


def _finite_number(value: Any) -> bool:
    """A usable time: JSON's 1e400 parses as infinity (and NaN is accepted), which no API
    answer can carry as a number, so one such line would break every read of the run's events."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past a float's range (a 400-digit time) is no time either
        return False
