"""`gpuwarden show`, `events` and `run --follow` in the units a person reads (JSON stays raw)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpuwarden.cli.event_lines import event_line
from gpuwarden.cli.show import detail_lines
from gpuwarden.core.api import RunDetail, RunEvent
from gpuwarden.core.api.runs import Restart
from gpuwarden.core.attempt_heading import attempt_heading
from tests.oom.test_explain import HOST_OOM

TS = 1_763_692_800.0


def _attempt(n: int, classification: str, reason: str) -> dict[str, Any]:
    return {
        "run_id": "r6fd6d23865", "attempt": n, "state": "ended", "pid": 960 + n, "create_time": TS,
        "started_at": TS + 100 * n, "ended_at": TS + 100 * n + 18, "exit_code": 3, "signal": None,
        "classification": classification, "reason": reason, "adopted": False, "events_offset": 0, "events_skipped": 0,
        "stdout_path": "o", "stderr_path": "e", "events_path": "ev", "gpus": [], "oom_kill_before": None,
    }  # fmt: skip


DETAIL = RunDetail.model_validate(
    {
        "id": "r6fd6d23865", "name": "oom-recovery-cpu", "kind": "train", "state": "succeeded", "attempt": 2,
        "message": "attempt 2: exit code 0", "created_at": TS, "updated_at": TS, "started_at": TS,
        "ended_at": TS + 300, "gpus": 0, "run_dir": "/runs/r6fd6d23865", "stop_requested": False,
        "spec": {}, "submitted_spec": {}, "effective_batch": 64,
        "attempts": [_attempt(1, "oom", "out of memory (exit code 3)"), _attempt(2, "succeeded", "exit code 0")],
        "retunes": [HOST_OOM],
        "report": {"steps": 3, "wall_s": 123.059, "mem_peak": 993251328, "samples_per_s": 1.56,
                   "joules_per_sample": 0.52, "samples_per_kwh": 6_923_076.0, "per_batch": {"16": {}}},
    }
)  # fmt: skip


def _event(kind: str, **fields: Any) -> RunEvent:
    return RunEvent.model_validate(
        {"type": kind, "ts": TS, "id": 6, "attempt": 1, "source": "runner", **fields}
    )


def test_show_reads_in_units_with_the_retune_as_a_sentence() -> None:
    oom = _event("oom", verdict="host_oom", phase="forward", message="can't allocate", batch_size=64)
    edited = _event("edited", changes={"train.batch_size": [64, 32]})
    text = "\n".join(detail_lines(DETAIL, [oom, edited]))
    assert (
        "    out of memory in forward (host: tried 128 MiB, limit 1.6 GiB) → micro-batch 64 → 16, "
        "accumulation 1 → 4, effective batch 64 kept; memory model: 24 fits with 9 % to spare; 16 "
        "chosen, the largest that divides 64"
    ) in text
    assert "retune after attempt 1 (host_oom, then succeeded):" in text
    assert "(18s)  out of memory (exit code 3)" in text
    assert ": train.batch_size 64 → 32" in text  # a person's edit is part of the story
    assert "mem_peak: 947 MiB" in text and "wall: 123.1 s" in text and "wall_s" not in text
    assert "joules_per_sample: 0.52" in text and "samples_per_kwh: 6.923e+06" in text  # energy, if any
    assert "993251328" not in text and "{" not in text


def test_event_lines_have_units_and_no_python_dicts() -> None:
    progress = _event(
        "progress", step=1, mem_peak=993251328, vm_peak=1399386112, samples_per_s=1.371, total=64
    )
    # `total` counts the run's samples here: a number, not bytes as an allocator's `total` is.
    assert event_line(progress).endswith(
        "progress: step=1 mem_peak=947 MiB vm_peak=1.3 GiB samples/s=1.371 total=64"
    )
    # The unit once: in the value or in the name, never both.
    finished = _event("finished", steps=40, wall_s=11.48, tokens_per_s=1331.2)
    assert event_line(finished).endswith("finished: steps=40 wall=11.48 s tokens/s=1331")
    # ... and so a runner's own `finished`, whose figures come in its report.
    reported = _event(
        "finished", report={"steps": 2, "samples_seen": 64, "wall_s": 9.946, "samples_per_s": 6.435}
    )
    assert event_line(reported).endswith("finished: steps=2 samples_seen=64 wall=9.946 s samples/s=6.435")
    retuned = _event("retuned", changes={"train.batch_size": 16}, verdict="host_oom")
    assert "retuned: (host_oom) changes=train.batch_size=16" not in event_line(retuned)
    assert "{" not in event_line(retuned) and "train.batch_size=16" in event_line(retuned)
    oom = _event("oom", verdict="host_oom", phase="forward", message="DefaultCPUAllocator: can't allocate")
    # --follow prints the program's stderr, which already has the allocator's message.
    assert "DefaultCPUAllocator" not in event_line(oom, with_message=False)
    assert "DefaultCPUAllocator" in event_line(oom)
    assert "out of memory (host_oom) in forward" in event_line(oom)


def test_the_fixed_memory_reads_as_a_sentence_in_the_cli_and_the_dashboard() -> None:
    from gpuwarden.tui.api_backend import event_text

    fields = {
        "fixed_bytes": 2302697472,
        "held_bytes": 1094737920,
        "gradient_bytes": 402653184,
        "optimizer_state_bytes": 805306368,
        "parameters": 100687872,
        "device": "cpu",
    }
    event = _event("fixed_memory", **fields)
    assert event_line(event).endswith(
        "fixed_memory: at least 2.1 GiB whatever the batch: 1.0 GiB held, 384 MiB of gradients and "
        "768 MiB of optimizer state to come (100.7 M parameters, cpu)"
    )
    assert event_text(event) == (
        "at least 2.1 GiB whatever the batch (1.0 GiB held, 384 MiB gradients and 768 MiB "
        "optimizer state to come)"
    )
    # Byte fields elsewhere say their unit once, in the value.
    assert event_line(_event("probe", peak_bytes=2**30)).endswith("probe: peak=1.0 GiB")


def test_a_stopping_event_says_when_the_sigkill_comes() -> None:
    at = dt.datetime(2026, 11, 23, 14, 5, 30).timestamp()
    line = event_line(_event("stopping", grace_seconds=30, kill_at=at))
    assert line.endswith("stopping: SIGTERM sent; SIGKILL at 14:05:30 if still running (grace 30 s)")


def test_a_restart_event_reads_as_a_sentence_with_its_clock_time() -> None:
    at = dt.datetime(2026, 11, 23, 14, 5, 33).timestamp()
    line = event_line(_event("restart", cause="exit code 75", restart=1, max=3, backoff_s=3, at=at))
    assert line.endswith("restart: restart 1 of 3 after exit code 75, at 14:05:33 (back-off 3 s)")
    # Any other moment a generic event carries is a clock time too, not a number of seconds.
    assert "noted: when=x resume_at=14:05:33" in event_line(_event("noted", when="x", resume_at=at))


def test_a_gangs_retune_keeps_the_effective_batch_of_all_its_ranks() -> None:
    # The retune records micro-batch and accumulation per rank, not the world size it left as it
    # was: the sentence multiplies by the run's two ranks, as its effective batch does.
    spec = {"kind": "train", "train": {"batch_size": 16, "grad_accum_steps": 4, "world_size": 2}}
    gang = DETAIL.model_copy(update={"spec": spec, "effective_batch": 128})
    text = "\n".join(detail_lines(gang, []))
    assert "effective batch: 128" in text
    assert "micro-batch 64 → 16, accumulation 1 → 4, effective batch 128 kept" in text
    # Its report.json is rank 0's: said so.
    assert "/report.json (rank 0 of 2; `gpuwarden report` covers every rank)" in text
    assert "(rank 0" not in "\n".join(detail_lines(DETAIL, []))  # one process: no such note


def _probe(phase: str, message: str, attempt: int = 1) -> RunEvent:
    return _event("probe", phase=phase, message=message, source="daemon", attempt=attempt)


def test_show_lists_each_probe_under_its_retune_and_the_latest_while_retuning() -> None:
    probes = [
        _probe("started", "probe 1 of 2: micro-batch 8 × 8 starting"),
        _probe("ended", "probe 1 of 2: micro-batch 8 → peak 1.1 GiB, fits (9.8 s)"),
        _probe("started", "probe 2 of 2: micro-batch 16 × 4 starting"),
        _probe("running", "probe 2 of 2: micro-batch 16 running, 5 s"),
        _probe("ended", "probe 2 of 2: micro-batch 16 → peak 1.3 GiB, fits (9.9 s)"),
    ]
    lines = list(detail_lines(DETAIL, probes))
    at = lines.index("retune after attempt 1 (host_oom, then succeeded):")
    assert lines[at + 2 : at + 4] == [
        "    probe 1 of 2: micro-batch 8 → peak 1.1 GiB, fits (9.8 s)",
        "    probe 2 of 2: micro-batch 16 → peak 1.3 GiB, fits (9.9 s)",
    ]
    assert not any(line.startswith("retuning") for line in lines)

    deciding = DETAIL.model_copy(
        update={
            "state": "retuning",
            "attempt": 1,
            "retunes": [],
            "attempts": DETAIL.attempts[:1],
            "report": None,
        }
    )
    lines = list(detail_lines(deciding, probes[:4]))
    assert lines[-2:] == ["retuning after attempt 1:", "    probe 2 of 2: micro-batch 16 running, 5 s"]
    assert "probe: probe 2 of 2: micro-batch 16 running, 5 s" in event_line(probes[3])
    # After its probes a retune may wait for memory: what it waits for is the latest word.
    waiting = _event("waiting", message="waiting for other processes to free GPU memory: 5 of 30 s")
    lines = list(detail_lines(deciding, [*probes, waiting]))
    assert lines[-1] == "    waiting for other processes to free GPU memory: 5 of 30 s"
    assert event_line(waiting).endswith("waiting: waiting for other processes to free GPU memory: 5 of 30 s")


def test_an_attempts_heading_says_what_it_was_started_with() -> None:
    retuned = attempt_heading(2, DETAIL.attempts, DETAIL.retunes)
    assert retuned == "── attempt 2: micro-batch 64 → 16, accumulation 1 → 4, effective batch 64 kept ──"
    assert attempt_heading(1, DETAIL.attempts, DETAIL.retunes) == "── attempt 1 ──"
    restarted = DETAIL.attempts[0].model_copy(
        update={"restart": Restart(cause="exit code 75", restart=1, max=3, backoff_s=10)}
    )
    heading = attempt_heading(2, [restarted, DETAIL.attempts[1]], [])
    assert heading == "── attempt 2: restart 1 of 3 after exit code 75 ──"
