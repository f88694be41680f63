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
from gpuwarden.runners.infer.example_models import write_prompts

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
def test_generate_finishes_with_report(tmp_path: Path, assets: dict[str, Path], run_runner: Runner) -> None:
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "task": "generate",
            "model": assets["llm"],
            "input": assets["prompts"],
            "batch_size": 8,
            "max_new_tokens": 8,
            "max_input_length": 48,
        },
    )
    result = run_runner(spec, tmp_path / "run")
    assert result.rc == EXIT_OK, result.stderr
    started = result.one("started")
    assert (started["device"], started["dtype"], started["samples_seen"]) == ("cpu", "fp32", 0)
    assert started["parameters"] > 0

    rows = assert_each_item_once(tmp_path / "run" / "outputs" / "generations.jsonl", assets["prompts"])
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


def stop_after_lines(proc: subprocess.Popen[str], output: Path, lines: int, signum: int) -> None:
    """Send `signum` to the runner once `output` holds `lines` lines, i.e. in the middle of the run."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if output.exists() and output.read_bytes().count(b"\n") >= lines:
            proc.send_signal(signum)
            return
        time.sleep(0.05)
    raise AssertionError(f"the run ended (rc {proc.poll()}) before {lines} items were written")


@pytest.mark.slow
def test_resume_after_sigkill_and_sigterm_loses_and_duplicates_nothing(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    # Many more items than the two stops need: under CI load the signal lands a few batches after
    # the threshold, and it must still land in the middle of the run, never after its last batch.
    total = 96
    prompts = write_prompts(tmp_path / "prompts.jsonl", total, seed=11, max_words=30)
    run_dir = tmp_path / "run"
    output = run_dir / "outputs" / "generations.jsonl"
    infer = {"task": "generate", "model": assets["llm"], "input": prompts, "max_new_tokens": 12}

    # Attempt 1: SIGKILL (the kernel's OOM killer, or the daemon after the grace period).
    proc = start_runner(write_spec(tmp_path / "spec1.yaml", {**infer, "batch_size": 2}), run_dir, attempt=1)
    stop_after_lines(proc, output, 4, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    done_first = len(read_jsonl(output))
    assert 4 <= done_first < total

    # Attempt 2, another batch size as after a retune: SIGTERM stops it between two batches.
    started = time.monotonic()
    proc = start_runner(write_spec(tmp_path / "spec2.yaml", {**infer, "batch_size": 4}), run_dir, attempt=2)
    stop_after_lines(proc, output, done_first + 4, signal.SIGTERM)
    second = finish(proc, run_dir, 2, started)
    assert second.rc == EXIT_TERMINATED, second.stderr
    assert second.one("started")["samples_seen"] == done_first
    assert second.one("started")["resumed_from"] == str(output)
    assert not second.of_type("finished") and "Traceback" not in second.stderr
    done_second = len(read_jsonl(output))
    assert done_first + 4 <= done_second < total
    # Stopped between two batches: attempt 2 wrote whole batches only.
    assert (done_second - done_first) % 4 == 0

    started = time.monotonic()
    third = finish(
        start_runner(write_spec(tmp_path / "spec3.yaml", {**infer, "batch_size": 8}), run_dir, attempt=3),
        run_dir,
        3,
        started,
    )
    assert third.rc == EXIT_OK, third.stderr
    rows = assert_each_item_once(output, prompts)
    assert {r["attempt"] for r in rows} == {1, 2, 3}
    # Batches count on across attempts, like a training run's steps.
    steps = [
        [
            e["step"]
            for e in read_events(run_dir / "attempts" / str(n) / "events.jsonl")
            if e["type"] == "progress"
        ]
        for n in (1, 2, 3)
    ]
    assert steps[1][0] == steps[0][-1] + 1 and steps[2][0] == steps[1][-1] + 1
    report = third.one("finished")["report"]
    assert report["items_done_before"] == done_second
    assert report["items_processed"] == total - done_second


@pytest.mark.slow
def test_partial_trailing_line_is_repaired(
    tmp_path: Path, assets: dict[str, Path], run_runner: Runner
) -> None:
    run_dir = tmp_path / "run"
    output = run_dir / "outputs" / "generations.jsonl"
    output.parent.mkdir(parents=True)
    ids = input_ids(assets["prompts"])
    kept = [{"id": ids[0], "prompt": "-", "output": "from an earlier attempt"}]
    output.write_text(
        json.dumps(kept[0]) + "\n" + '{"id": "' + ids[1] + '", "prompt": "half', encoding="utf-8"
    )
    spec = write_spec(
        tmp_path / "spec.yaml",
        {"task": "generate", "model": assets["llm"], "input": assets["prompts"], "max_new_tokens": 4},
    )
    result = run_runner(spec, run_dir)
    assert result.rc == EXIT_OK, result.stderr
    assert len(result.warnings("partial_output_repaired")) == 1
    assert result.one("started")["samples_seen"] == 1
    rows = assert_each_item_once(output, assets["prompts"])
    assert rows[0] == kept[0], "an item done before was generated again"
    assert next(r for r in rows if r["id"] == ids[1])["attempt"] == 1


def test_missing_model_is_an_error_event_without_traceback(
    tmp_path: Path, assets: dict[str, Path], run_runner: Runner
) -> None:
    spec = write_spec(
        tmp_path / "spec.yaml",
        {"task": "generate", "model": tmp_path / "no-such-model", "input": assets["prompts"]},
    )
    result = run_runner(spec, tmp_path / "run")
    assert result.rc == EXIT_USER_ERROR
    error = result.one("error")
    assert error["code"] == "missing_model" and "no-such-model" in error["message"]
    assert "Traceback" not in result.stderr and "does not exist" in result.stderr
    assert not result.of_type("started")


def test_load_in_8bit_on_cpu_is_a_clear_error(
    tmp_path: Path, assets: dict[str, Path], run_runner: Runner
) -> None:
    spec = write_spec(
        tmp_path / "spec.yaml",
        {"task": "generate", "model": assets["llm"], "input": assets["prompts"], "load_in_8bit": True},
    )
    result = run_runner(spec, tmp_path / "run")
    assert result.rc == EXIT_USER_ERROR
    error = result.one("error")
    assert error["code"] == "unsupported"
    assert error["message"].startswith("load_in_8bit needs CUDA and bitsandbytes — remove it or run on a GPU")
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_offloaded_weights_are_reported(tmp_path: Path, assets: dict[str, Path], run_runner: Runner) -> None:
    # A host budget far below the model's size: accelerate puts the weights on disk (
    # "Some parameters are on the meta device because they were offloaded"); the run still works.
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "task": "generate",
            "model": assets["llm"],
            "input": assets["prompts"],
            "max_new_tokens": 2,
            "batch_size": 12,
            "max_memory": {"cpu": "100KB"},
        },
    )
    result = run_runner(spec, tmp_path / "run")
    assert result.rc == EXIT_OK, result.stderr
    (warning,) = result.warnings("offloaded_to_cpu")
    assert warning["used"].get("disk", 0) > 0 and warning["requested"] == {"cpu": "100KB"}
    assert result.one("finished")["report"]["device_map"] == warning["used"]
    assert_each_item_once(tmp_path / "run" / "outputs" / "generations.jsonl", assets["prompts"])


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
