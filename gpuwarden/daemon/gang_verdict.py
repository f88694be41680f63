"""How a gang's attempt ended, decided from its ranks rather than from torchrun's exit code
(torchrun exits 1 whenever any rank failed, whichever rank and whatever the cause).

`core.gang.outcome.read_gang_outcome` says which rank failed first on its own (its `oom`/`error`
event, its error file, torchrun's failure summary); that rank's evidence — its event, its exit
status, its own stderr — decides, as the process's would for a one-process attempt. Ranks that
stopped because another one failed (`gang_aborted`) never decide.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuwarden.core.events import EXIT_OOM
from gpuwarden.core.gang.outcome import GangOutcome, RankOutcome
from gpuwarden.core.oom.classify import classify_text
from gpuwarden.daemon.process import ExitStatus, ExitVerdict, classify


@dataclass(frozen=True)
class RankEvidence:
    """What a retune or a restart policy goes by: the failed rank, its exit status, its stderr."""

    rank: int | None
    status: ExitStatus
    stderr_tail: str


def rank_status(rank: RankOutcome) -> ExitStatus:
    """A rank's exit status as torchrun reported it (negative: the signal that killed it)."""
    code = rank.exit_code
    if code is None:
        return ExitStatus(None, None)
    return ExitStatus(None, -code) if code < 0 else ExitStatus(code, None)


def gang_verdict(
    status: ExitStatus,
    outcome: GangOutcome,
    *,
    stop_requested: bool,
    hang_reason: str | None,
    oom_kill: bool | None,
    rank_stderr: Callable[[int], str],
    torchrun_stderr: str,
    rank0_event: str | None,
    memory_limit: int | None = None,
) -> tuple[ExitVerdict, RankEvidence]:
    """The attempt's verdict and the evidence behind it (`memory_limit`: every rank's
    address-space limit, where the run has one)."""
    first = outcome.first_failure
    if hang_reason is not None:
        return ExitVerdict("hang", hang_reason), RankEvidence(None, status, torchrun_stderr)
    if stop_requested or first is None:
        # No rank failed on its own: a stop, a finished gang, or torchrun itself went wrong.
        verdict = classify(
            status, stop_requested=stop_requested, oom_kills_delta=None, last_runner_event=rank0_event
        )
        if verdict.outcome == "oom":  # only a rank's own oom says so, and none did
            verdict = ExitVerdict(
                "failed", f"torchrun ended ({status.describe()}) with no rank failure found"
            )
        return verdict, RankEvidence(None, status, torchrun_stderr)
    stderr = rank_stderr(first.rank) or torchrun_stderr
    evidence = RankEvidence(first.rank, rank_status(first), stderr)
    return _rank_verdict(first, evidence, oom_kill, memory_limit), evidence


def _rank_verdict(
    first: RankOutcome, evidence: RankEvidence, oom_kill: bool | None, memory_limit: int | None
) -> ExitVerdict:
    who = f"rank {first.rank}"
    how = evidence.status.describe() if evidence.status.known else "exit status unknown"
    if (first.failure is not None and first.failure.get("type") == "oom") or first.exit_code == EXIT_OOM:
        return ExitVerdict("oom", f"{who}: {first.message or 'out of memory'} ({how})")
    text = classify_text(
        evidence.stderr_tail,
        exit_code=evidence.status.code,
        signal=evidence.status.signal,
        oom_kill=oom_kill,
        memory_limit=memory_limit,
    )
    if text.is_oom:
        return ExitVerdict("oom", f"{who}: {text.verdict}: {text.reason} ({how})")
    if text.verdict == "shape_bug":
        return ExitVerdict("failed", f"{who}: shape_bug: {text.reason} ({how})")
    return ExitVerdict("failed", f"{who}: {first.message or 'failed'} ({how})")
