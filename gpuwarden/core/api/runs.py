"""Answers about runs: summaries, details, attempts, retunes, metrics, events and log slices."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field

from gpuwarden.core.api.base import ApiModel
from gpuwarden.core.run_state import RunState

RunKind = Literal["command", "train", "infer"]
# Progress numbers are stored as the runner reported them: a user's script may send 3.0 for 3.
Number = int | float


class RunSummary(ApiModel):
    """The fields of a run that lists and `run` stream frames carry."""

    id: str
    name: str
    kind: RunKind
    state: RunState
    attempt: int = Field(description="number of the latest attempt, 0 before the first")
    message: str | None = Field(description="one line: why the run is in its state")
    created_at: float
    updated_at: float
    started_at: float | None
    ended_at: float | None
    gpus: int | list[str] | None = Field(description="the spec's resources.gpus: a count or GPU names")

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RunSummary:
        """The summary of a `runs` row as the store reads it (spec decoded)."""
        return cls.model_validate(
            {
                **{name: row[name] for name in cls.model_fields if name != "gpus"},
                "gpus": row["spec"].get("resources", {}).get("gpus"),
            }
        )


class RunList(ApiModel):
    runs: list[RunSummary]


class ConfigCopy(ApiModel):
    """An attempt's copy of the user's config file: the keys gpuwarden changed and the diff."""

    source: str = Field(description="the user's file (never written)")
    path: str = Field(description="the attempt's copy, named by {config_file}")
    changes: dict[str, tuple[Any, Any]] = Field(description="key path → [before, after]")
    diff: str = Field(description="unified diff of the copy against the user's file")


class AttemptRecord(ApiModel):
    """What gpuwarden handed one attempt of a user's program (attempts/<n>/prepared.json)."""

    prepared_at: float
    argv: list[str]
    cwd: str
    knobs: dict[str, Any]
    env: dict[str, str] = Field(description="environment variables bound to knobs")
    config: ConfigCopy | None = None
    resume_from: str | None = Field(
        None,
        description="the checkpoint handed to the program; None when none was: a first attempt, none "
        "complete, or a command that passes {resume_from} nowhere",
    )
    resume_note: str | None = None
    started_warm: bool = Field(
        False,
        description="started in an interpreter that imported the script's libraries while the attempt "
        "before it ran (a warm restart)",
    )


class Restart(ApiModel):
    """A restart the run's restart policy scheduled after an attempt that failed (not from OOM)."""

    cause: str = Field(description="e.g. 'killed by SIGKILL', 'exit code 75', 'died without a final event'")
    restart: int = Field(description="its number among the run's restarts")
    max: int = Field(description="the policy's bound")
    backoff_s: float = Field(description="seconds waited before the next attempt")


class RankStatus(ApiModel):
    """One process ("rank") of a multi-process attempt, from the newest events it wrote."""

    rank: int
    pid: int | None = Field(description="from its `started` event")
    gpu: str | None = Field(description="the GPU UUID it uses; None on the CPU")
    device: str | None = Field(description="`cuda:0`, `cpu`: what the rank said it uses")
    step: Number | None = Field(description="its last reported optimizer step")
    samples_seen: Number | None
    progress_at: float | None = Field(description="when it last reported progress")
    mem_allocated: Number | None
    mem_reserved: Number | None
    mem_peak: Number | None = Field(description="its peak GPU memory (bytes)")
    vm_peak: Number | None = Field(description="CPU ranks: its peak address space (bytes)")
    last_event: str | None = Field(description="type of the newest event it wrote")
    failure: str | None = Field(description="its own `oom` (verdict) or `error` (code), if any")
    straggler: bool = Field(description="the rank the others wait for (see straggler_reason)")
    straggler_reason: str | None


class Attempt(ApiModel):
    """One process started for a run (with `world_size` > 1: torchrun and its ranks)."""

    run_id: str
    attempt: int
    state: Literal["starting", "running", "ended"]
    pid: int | None = Field(
        description="the attempt's process (a command run's: gpuwarden's exit-status recorder)"
    )
    program_pid: int | None = Field(
        None,
        description="the program itself (differs from `pid` for command runs): read live while it "
        "runs, from its exit record once it ended",
    )
    peak_rss: int | None = Field(
        None,
        description="the program's peak resident set (bytes) as the kernel counted it, from its exit "
        "record once it ended (the largest process of a gang)",
    )
    create_time: float | None = Field(description="psutil create time: (pid, create_time) names the process")
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    signal: int | None
    classification: str | None = Field(
        description="succeeded | failed | oom | hang | stopped | terminated | interrupted, once ended"
    )
    reason: str | None
    adopted: bool = Field(description="re-adopted by a restarted daemon")
    events_offset: int
    events_skipped: int = Field(description="lines of events.jsonl that did not parse")
    stdout_path: str
    stderr_path: str
    events_path: str
    gpus: list[str] = Field(description="GPU UUIDs; [] on the CPU")
    oom_kill_before: int | None
    prepared: AttemptRecord | None = Field(None, description="command runs: argv, knobs, config copy, resume")
    resumed_from: str | None = Field(
        None,
        description="the checkpoint it resumed from: the one it reported loading (its `started` event), "
        "else the one its command was handed; None when it started from the beginning",
    )
    resume_warning: str | None = Field(
        None, description="why its resume differs from an uninterrupted run (an `inexact_resume` warning)"
    )
    restart: Restart | None = Field(None, description="the restart scheduled after this attempt, if any")
    world_size: int = Field(1, description="processes of a multi-process (torchrun) attempt; 1 otherwise")
    ranks: list[RankStatus] = Field(default_factory=list, description="each rank when world_size > 1")
    gpu_energy_j: dict[str, float] = Field(
        default_factory=dict,
        description="joules each GPU used between its energy counter read as the attempt started and "
        "as it ended; empty until both are read (the run's energy then comes from the samples)",
    )


class AttemptList(ApiModel):
    attempts: list[Attempt]


class Retune(ApiModel):
    """A retune decision: the settings before and after, why, and how the next attempt went."""

    model_config = ConfigDict(validate_by_name=True, serialize_by_alias=True)

    id: int
    run_id: str
    attempt: int = Field(description="the attempt that failed")
    ts: float
    verdict: str | None
    outcome: str | None = Field(description="filled in when the next attempt ends")
    before: dict[str, Any] = Field(alias="from")
    after: dict[str, Any] = Field(alias="to")
    evidence: dict[str, Any] | None
    prediction: dict[str, Any] | None


class RetuneList(ApiModel):
    retunes: list[Retune]


class RunMetric(ApiModel):
    """One progress report of a run."""

    run_id: str
    attempt: int
    ts: float
    step: Number | None = None
    samples_seen: Number | None = None
    tokens_seen: Number | None = None
    loss: float | None = None
    lr: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    batch_size: Number | None = None
    mem_allocated: Number | None = None
    mem_reserved: Number | None = None
    mem_peak: Number | None = None


class MetricList(ApiModel):
    metrics: list[RunMetric]


class RunEvent(ApiModel):
    """A stored run event: the event as written (the envelope `v`, `type`, `ts` and the fields of
    its type, kept whole whatever a script wrote) plus where it came from. On the live stream it
    also carries `run_id`."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="started, progress, checkpoint, warning, oom, error, finished, state, …")
    ts: float
    id: int
    attempt: int | None = Field(description="None for what the daemon says before the first attempt")
    source: Literal["runner", "daemon"]


class EventsPage(ApiModel):
    events: list[RunEvent]
    next_since: int = Field(description="pass as `since` to read on")
    state: RunState | Literal["deleted"] = Field(description="the run's state when the page was read")


class AttemptEnergyReading(ApiModel):
    """One attempt's energy: joules its GPUs used over its window, samples it did."""

    attempt: int
    joules: float | None = Field(description="None without an energy counter (CPU, old GPUs)")
    samples: int
    per_sample_j: float | None
    samples_per_kwh: float | None


class RunEnergy(ApiModel):
    """A run's energy per sample from the GPUs' energy counters, over the attempts with a reading."""

    joules: float | None = None
    samples: int | None = None
    per_sample_j: float | None = None
    samples_per_kwh: float | None = None
    per_token_j: float | None = Field(default=None, description="set by reports that know the tokens done")
    per_attempt: list[AttemptEnergyReading] = Field(default_factory=list)


class RunDetail(RunSummary):
    """One run whole: its summary, spec, attempts, retunes, report and energy."""

    run_dir: str
    stop_requested: bool
    spec: dict[str, Any] = Field(description="the spec as it stands (edits and retunes change it)")
    submitted_spec: dict[str, Any]
    attempts: list[Attempt]
    retunes: list[Retune]
    effective_batch: int | None = Field(description="micro-batch × accumulation × world size (train)")
    report: dict[str, Any] | None = Field(description="the run's report.json, once written")
    energy: RunEnergy = Field(default_factory=RunEnergy, description="empty until an attempt has run")


class LogSlice(ApiModel):
    """Bytes of a log from an offset on, decoded, never splitting a UTF-8 character."""

    data: str
    offset: int = Field(description="where `data` starts")
    next_offset: int = Field(description="where the next read starts")
    overflow: bool = Field(description="bytes before `offset` were skipped")
    size: int = Field(description="the log's size when read")
    modified: float | None = Field(
        default=None, description="when the log was last written (seconds since the epoch); None: no log yet"
    )


class LogChunk(LogSlice):
    eof: bool = Field(description="the attempt has ended and everything was read")
    attempt: int
    stream: Literal["stdout", "stderr"]


class Deleted(ApiModel):
    deleted: str = Field(description="the id of the run forgotten")
