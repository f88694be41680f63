"""`task: generate` end to end, as the daemon runs it: a real `python -m gpuwarden.runners` process."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.events import EXIT_OK, EXIT_OOM, EXIT_TERMINATED, EXIT_USER_ERROR
from gpuwarden.runners.__main__ import run_body
from gpuwarden.runners.events import EventWriter
from gpuwarden.runners.infer.example_models import write_prompts
from gpuwarden.runners.pause_hook import PAUSE_ENV

from .conftest import RunResult, finish, read_events, read_jsonl, start_runner, write_spec

Runner = Callable[..., RunResult]


def input_ids(prompts: Path) -> list[str]:
    return [
        json.loads(line)["id"] for line in prompts.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def assert_each_item_once(output: Path, prompts: Path) -> list[dict[str, Any]]:
    rows = read_jsonl(output)
    ids = [row["id"] for row in rows]
    assert len(ids) == len(set(ids)), f"duplicated items: {sorted(i for i in ids if ids.count(i) > 1)}"
    assert set(ids) == set(input_ids(prompts)), "items lost"
    return rows


@pytest.mark.slow
def test_generate_finishes_with_report_its_weights_offloaded(
    tmp_path: Path, lm_assets: dict[str, Path], run_runner: Runner
) -> None:
    # A host budget far below the model's size: accelerate puts the weights on disk ("Some
    # parameters are on the meta device because they were offloaded"); the run says so and works
    # all the same. (The resume test's attempts load their model whole.)
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "task": "generate",
            "model": lm_assets["llm"],
            "input": lm_assets["prompts"],
            "batch_size": 8,
            "max_new_tokens": 8,
            "max_input_length": 48,
            "max_memory": {"cpu": "100KB"},
        },
    )
    result = run_runner(spec, tmp_path / "run")
    assert result.rc == EXIT_OK, result.stderr
    (warning,) = result.warnings("offloaded_to_cpu")
    assert warning["used"].get("disk", 0) > 0 and warning["requested"] == {"cpu": "100KB"}
    started = result.one("started")
    assert (started["device"], started["dtype"], started["samples_seen"]) == ("cpu", "fp32", 0)
    assert started["parameters"] > 0

    rows = assert_each_item_once(tmp_path / "run" / "outputs" / "generations.jsonl", lm_assets["prompts"])
    assert all(r["tokens_out"] > 0 and r["tokens_in"] <= 48 and r["batch_size"] == 8 for r in rows)
    assert any(r["truncated"] for r in rows) and all(isinstance(r["output"], str) for r in rows)
    # Batches run longest first, so the input lengths never grow down the file.
    lengths = [r["tokens_in"] for r in rows]
    assert lengths == sorted(lengths, reverse=True)

    progress = result.of_type("progress")
    assert [p["samples_seen"] for p in progress] == [8, 16, 24]
    assert all(p["total"] == 24 and p["batch_size"] == 8 and p["mem_peak"] > 0 for p in progress)
    assert all(p["samples_per_s"] > 0 and p["tokens_per_s"] > 0 for p in progress)

    report = result.one("finished")["report"]
    assert report == json.loads((tmp_path / "run" / "report.json").read_text(encoding="utf-8"))
    assert report["items_processed"] == 24 and report["items_failed"] == 0
    assert report["per_batch_size"]["8"]["batches"] == 3
    assert report["tokens_out"] == sum(r["tokens_out"] for r in rows)
    assert report["peak_memory_bytes"] > 0 and report["energy_j"] is None
    assert report["items_per_s"] > 0 and report["per_item_s"] > 0
    assert report["device_map"] == warning["used"]


def stop_at_step(proc: subprocess.Popen[str], run_dir: Path, attempt: int, step: int, signum: int) -> None:
    """Send `signum` once attempt `attempt` has reported batch `step`; the pause hook holds the
    runner there until a stop arrives, so the signal lands before the next batch."""
    events = run_dir / "attempts" / str(attempt) / "events.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if any(e["type"] == "progress" and e["step"] == step for e in read_events(events)):
            proc.send_signal(signum)
            return
        time.sleep(0.05)
    raise AssertionError(f"attempt {attempt} ended (rc {proc.poll()}) before batch {step}")


@pytest.mark.slow
def test_resume_after_sigkill_and_sigterm_loses_and_duplicates_nothing(
    tmp_path: Path, lm_assets: dict[str, Path]
) -> None:
    total = 20
    prompts = write_prompts(tmp_path / "prompts.jsonl", total, seed=11, max_words=30)
    run_dir = tmp_path / "run"
    output = run_dir / "outputs" / "generations.jsonl"
    infer = {"task": "generate", "model": lm_assets["llm"], "input": prompts, "max_new_tokens": 12}

    def start(attempt: int, batch_size: int, pause_after: int | None = None) -> subprocess.Popen[str]:
        spec = write_spec(tmp_path / f"spec{attempt}.yaml", {**infer, "batch_size": batch_size})
        env = {PAUSE_ENV: f"0:{pause_after}"} if pause_after is not None else None
        return start_runner(spec, run_dir, attempt=attempt, env=env)

    # Attempt 1: SIGKILL (the kernel's OOM killer, or the daemon after the grace period) after
    # two batches of 2, as it was writing the next item's line: half of that line is left.
    proc = start(1, 2, pause_after=2)
    stop_at_step(proc, run_dir, 1, 2, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    done = {row["id"] for row in read_jsonl(output)}
    assert len(done) == 4
    half = next(i for i in input_ids(prompts) if i not in done)
    with open(output, "a", encoding="utf-8") as out:
        out.write('{"id": "' + half + '", "prompt": "half')

    # Attempt 2, another batch size as after a retune: it drops the half line (that item is
    # generated again), and SIGTERM stops it between its second and third batch (batches count
    # on from attempt 1's).
    started = time.monotonic()
    proc = start(2, 4, pause_after=4)
    stop_at_step(proc, run_dir, 2, 4, signal.SIGTERM)
    second = finish(proc, run_dir, 2, started)
    assert second.rc == EXIT_TERMINATED, second.stderr
    assert len(second.warnings("partial_output_repaired")) == 1
    assert second.one("started")["samples_seen"] == 4
    assert second.one("started")["resumed_from"] == str(output)
    assert not second.of_type("finished") and "Traceback" not in second.stderr
    assert len(read_jsonl(output)) == 4 + 2 * 4

    started = time.monotonic()
    third = finish(start(3, 8), run_dir, 3, started)
    assert third.rc == EXIT_OK, third.stderr
    rows = assert_each_item_once(output, prompts)
    assert {r["attempt"] for r in rows} == {1, 2, 3}
    assert next(r for r in rows if r["id"] == half)["attempt"] > 1
    # Batches count on across attempts, like a training run's steps.
    steps = [
        [
            e["step"]
            for e in read_events(run_dir / "attempts" / str(n) / "events.jsonl")
            if e["type"] == "progress"
        ]
        for n in (1, 2, 3)
    ]
    assert steps == [[1, 2], [3, 4], [5]]
    report = third.one("finished")["report"]
    assert report["items_done_before"] == 12
    assert report["items_processed"] == total - 12


def test_missing_model_is_an_error_event_without_traceback(
    tmp_path: Path, lm_assets: dict[str, Path], run_runner: Runner
) -> None:
    # The model directory is checked before either inference task starts: this covers image_to_text too.
    spec = write_spec(
        tmp_path / "spec.yaml",
        {"task": "generate", "model": tmp_path / "no-such-model", "input": lm_assets["prompts"]},
    )
    result = run_runner(spec, tmp_path / "run")
    assert result.rc == EXIT_USER_ERROR
    error = result.one("error")
    assert error["code"] == "missing_model" and "no-such-model" in error["message"]
    assert "Traceback" not in result.stderr and "does not exist" in result.stderr
    assert not result.of_type("started")


def test_load_in_8bit_on_cpu_is_a_clear_error(
    tmp_path: Path, lm_assets: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # Refused before the model loads: the runner's run_body in this process makes the same event,
    # message and status as a runner process would (the missing-model test above starts one).
    spec = write_spec(
        tmp_path / "spec.yaml",
        {"task": "generate", "model": lm_assets["llm"], "input": lm_assets["prompts"], "load_in_8bit": True},
    )
    events_path = tmp_path / "run" / "attempts" / "1" / "events.jsonl"
    with EventWriter(events_path) as events:
        rc = run_body(spec, tmp_path / "run", 1, events)
    assert rc == EXIT_USER_ERROR
    (error,) = [e for e in read_events(events_path) if e["type"] == "error"]
    assert error["code"] == "unsupported"
    assert error["message"].startswith("load_in_8bit needs CUDA and bitsandbytes — remove it or run on a GPU")
    assert capsys.readouterr().err == f"gpuwarden: {error['message']}\n"


# Imports map ~0.8 GB and batch 1 of the wide model peaks near 1.15 GB of address space; batch 8
# needs ~2.1 GB (see `oom_assets`). 1.6 GiB sits between them with ~0.4 GB either side.
ADDRESS_SPACE_LIMIT = int(1.6 * (1 << 30))


@pytest.mark.slow
def test_real_host_oom_then_smaller_batch_finishes(
    tmp_path: Path, oom_assets: dict[str, Path], run_runner: Runner
) -> None:
    run_dir = tmp_path / "run"
    infer = {
        "task": "generate",
        "model": oom_assets["llm"],
        "input": oom_assets["prompts"],
        "max_new_tokens": 2,
        "max_input_length": 1024,
        "attn_implementation": "eager",
    }
    big = write_spec(tmp_path / "big.yaml", {**infer, "batch_size": 8})
    failed = run_runner(big, run_dir, attempt=1, limit_as=ADDRESS_SPACE_LIMIT)
    assert failed.rc == EXIT_OOM, failed.stderr
    oom = failed.one("oom")
    assert (oom["verdict"], oom["phase"], oom["batch_size"]) == ("host_oom", "generate", 8)
    assert "can't allocate memory" in oom["message"] and oom["fields"]["requested"] > 0
    assert not failed.of_type("finished") and "Traceback" not in failed.stderr

    small = write_spec(tmp_path / "small.yaml", {**infer, "batch_size": 2})
    retried = run_runner(small, run_dir, attempt=2, limit_as=ADDRESS_SPACE_LIMIT)
    assert retried.rc == EXIT_OK, retried.stderr
    assert_each_item_once(run_dir / "outputs" / "generations.jsonl", oom_assets["prompts"])
    assert retried.one("finished")["report"]["per_batch_size"]["2"]["batches"] == 4
