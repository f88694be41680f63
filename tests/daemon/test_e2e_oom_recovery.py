"""Out-of-memory recovery end to end: a real daemon, real runner processes, real allocation
failures (an address-space limit makes torch's CPU allocator fail), real restarts — each retune
seen as it happens, each probe an event with never more than a few seconds of silence between."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from gpuwarden.core.api import RunEvent
from gpuwarden.core.rlimit import limited_argv
from gpuwarden.runners.infer.example_models import write_prompts
from gpuwarden.runners.testing_models import build_tiny_causal_lm
from tests.daemon.conftest import DaemonHandle, wait_for

REPO = Path(__file__).resolve().parents[2]
PINNED = {"OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}  # as the example pins them

# The shipped example is what this test runs: micro-batch 32 under a 1.4 GiB address-space limit.
TRAIN_SPEC = (REPO / "configs" / "examples" / "oom-recovery-cpu.yaml").read_text()
EFFECTIVE = 32
SILENCE_S = 5.0  # the longest a retuning run may go without an event
# `probe 2 of 2: micro-batch 16 → peak 1.3 GiB, fits (9.8 s)`
PROBE_ENDED = re.compile(r"probe (\d) of 2: micro-batch (\d+) → peak [\d.]+ [KMG]iB, fits \([\d.]+ s\)$")


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    state = torch.load(run_dir / "outputs" / "model" / "model.pt", map_location="cpu", weights_only=True)
    assert isinstance(state, dict)
    return state


def _runs_under_the_limit(folder: Path, micro: int) -> bool:
    """The example at micro × (32 / micro), run by the runner alone under its own 1.4 GiB limit."""
    folder.mkdir()
    spec = folder / "spec.yaml"
    spec.write_text(
        TRAIN_SPEC.replace(f"batch_size: {EFFECTIVE}", f"batch_size: {micro}").replace(
            "grad_accum_steps: 1 ", f"grad_accum_steps: {EFFECTIVE // micro} "
        )
    )
    argv = [sys.executable, "-m", "gpuwarden.runners", "--spec", str(spec), "--run-dir", str(folder / "run")]
    limited = limited_argv(argv, int(1.4 * 2**30))
    done = subprocess.run(limited, env={**os.environ, **PINNED}, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 3), done.stderr[-2000:]  # ran, or ran out of memory (exit 3)
    return done.returncode == 0


def _events(gw: DaemonHandle, run_id: str) -> list[RunEvent]:
    with gw.client() as client:
        return client.events(run_id, limit=10_000).events


def _retuning(gw: DaemonHandle, run_id: str) -> list[RunEvent]:
    """The run's events from its move to `retuning` to its `retuned` (or the last so far)."""
    events = _events(gw, run_id)
    start = next(
        (
            i
            for i, e in enumerate(events)
            if e.type == "state" and (e.model_extra or {})["state"] == "retuning"
        ),
        None,
    )
    if start is None:
        return []
    end = next((i for i, e in enumerate(events) if e.type == "retuned"), len(events) - 1)
    return events[start : end + 1]


def _probe_messages(events: list[RunEvent], phase: str) -> list[str]:
    return [
        str((e.model_extra or {})["message"])
        for e in events
        if e.type == "probe" and (e.model_extra or {}).get("phase") == phase
    ]


def _follow_the_example_through_its_retune(gw: DaemonHandle, tmp_path: Path) -> tuple[str, str]:
    """`run --follow` of the shipped example; while its retune probes, `show` says which probe runs.
    Returns the run's id and what the follower printed."""
    spec = gw.write_spec("oom-recovery-cpu", TRAIN_SPEC)
    followed = tmp_path / "follow-output.txt"
    with followed.open("w") as out:
        follow = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "run", str(spec), "--follow"],
            env=gw.env,
            cwd=gw.root,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    run_id = wait_for(lambda: [r.id for r in gw.client().runs()], "the run submitted")[0]

    def probing_or_over() -> bool:
        return bool(_probe_messages(_retuning(gw, run_id), "started")) or follow.poll() is not None

    wait_for(probing_or_over, "a probe starting", timeout=300)
    shown = gw.cli("show", run_id)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "state:    retuning" in shown.stdout, shown.stdout
    at = lines.index("retuning after attempt 1:")
    assert lines[at + 1].startswith("    probe 1 of 2: micro-batch 4"), shown.stdout
    assert follow.wait(timeout=800) == 0, followed.read_text()[-3000:]
    return run_id, followed.read_text()


def _each_probe_was_told_as_it_ran(gw: DaemonHandle, run_id: str, followed: str) -> None:
    """Never silent while retuning, and every reader says each probe: the follower as they came,
    `events` and `show` afterwards."""
    retune = _retuning(gw, run_id)
    assert retune[-1].type == "retuned"
    gaps = [round(b.ts - a.ts, 2) for a, b in itertools.pairwise(retune)]
    assert max(gaps) <= SILENCE_S, list(zip([e.type for e in retune[1:]], gaps, strict=True))
    ended = _probe_messages(retune, "ended")
    assert [PROBE_ENDED.match(m).groups() for m in ended] == [("1", "4"), ("2", "16")], ended  # type: ignore[union-attr]
    assert _probe_messages(retune, "started") == [
        "probe 1 of 2: micro-batch 4 × 8 starting",
        "probe 2 of 2: micro-batch 16 × 2 starting",
    ]
    assert all(e.attempt == 1 and e.source == "daemon" for e in retune if e.type == "probe")
    assert all(f"probe: {message}" in followed for message in ended), followed
    listed = gw.cli("events", run_id).stdout
    assert all(f"probe: {message}" in listed for message in ended), listed
    shown_after = gw.cli("show", run_id).stdout.splitlines()
    under = shown_after.index(next(line for line in shown_after if line.startswith("retune after attempt 1")))
    assert shown_after[under + 2 : under + 4] == [f"    {message}" for message in ended], shown_after


# One real recovery of the shipped example, read every way a user reads it: as it happens (each
# probe told, never silent), what it decided (the largest size that runs), and what it trained
# (the weights of an uninterrupted run).
@pytest.mark.slow
@pytest.mark.timeout(1200)  # the probes run the attempt's whole accumulation, resumed from its checkpoint
def test_training_oom_is_retuned_keeping_the_effective_batch_and_matches_an_uninterrupted_run(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    run_id, followed = _follow_the_example_through_its_retune(gw, tmp_path)
    assert "host_oom" in followed and "retuned" in followed
    _each_probe_was_told_as_it_ran(gw, run_id, followed)

    detail = gw.cli_json("show", "oom-recovery-cpu")
    assert detail["state"] == "succeeded"
    assert detail["effective_batch"] == EFFECTIVE
    (retune,) = detail["retunes"]
    assert retune["verdict"] == "host_oom"
    assert retune["from"] == {"train.batch_size": EFFECTIVE, "train.grad_accum_steps": 1}
    new_batch = retune["to"]["train.batch_size"]
    assert retune["to"] == {"train.batch_size": new_batch, "train.grad_accum_steps": EFFECTIVE // new_batch}
    # The largest micro-batch that keeps the effective batch and runs under the limit, found by
    # trying: 32 ran out (attempt 1), the chosen one ran (attempt 2); each divisor between them
    # runs here, alone, under the same limit. The retune must take ≥ 90 % of the largest.
    between = [d for d in range(new_batch + 1, EFFECTIVE) if EFFECTIVE % d == 0]
    ran = [d for d in between if _runs_under_the_limit(tmp_path / f"try-{d}", d)]
    assert new_batch >= 0.9 * max([new_batch, *ran]), (new_batch, ran, retune["prediction"])
    # The memory model's prediction was made from probes and its outcome recorded: one restart;
    # the probes measured the size chosen rather than extrapolating to it.
    assert retune["prediction"]["batch"] >= new_batch and "fit" in retune["prediction"]["basis"]
    probed = [p["batch_size"] for p in retune["evidence"]["probes"] if not p["oom"]]
    assert new_batch in probed, retune["evidence"]["probes"]
    # Every size measured by one probe process, which loaded the model once.
    sizes = len(retune["evidence"]["probes"])
    assert retune["evidence"]["decided"] == f"1 probe process, {sizes} size{'s' if sizes > 1 else ''}"
    shown_detail = gw.cli("show", "oom-recovery-cpu").stdout
    assert f"memory model: {retune['prediction']['batch']} fits with" in shown_detail
    assert f"; {new_batch} chosen" in shown_detail
    assert retune["outcome"] == "succeeded"
    assert len(detail["attempts"]) == 2
    assert [a["classification"] for a in detail["attempts"]] == ["oom", "succeeded"]

    # An uninterrupted run at the fitting micro-batch reaches the same weights.
    reference_spec = tmp_path / "reference.yaml"
    reference_spec.write_text(
        TRAIN_SPEC.replace("name: oom-recovery-cpu", "name: reference")
        .replace(f"batch_size: {EFFECTIVE}", f"batch_size: {new_batch}")
        .replace("grad_accum_steps: 1 ", f"grad_accum_steps: {EFFECTIVE // new_batch} ")
        .replace("memory_limit: 1.4GiB", "memory_limit: 4GiB")
    )
    ref_dir = tmp_path / "reference-run"
    done = subprocess.run(
        [sys.executable, "-m", "gpuwarden.runners", "--spec", str(reference_spec), "--run-dir", str(ref_dir)],
        env={**os.environ, **PINNED},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    recovered = _final_weights(Path(detail["run_dir"]))
    reference = _final_weights(ref_dir)
    assert recovered.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(recovered[name], tensor, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
def test_inference_oom_is_retuned_with_no_item_lost_or_duplicated(gw: DaemonHandle, tmp_path: Path) -> None:
    # Eager attention over 1024 tokens with 16 heads: batch 8 needs ~2.1 GB of address space,
    # batch 1 ~1.15 GB (tests/runners_infer/conftest.py: oom_assets).
    model = build_tiny_causal_lm(tmp_path / "wide-llm", hidden=256, layers=1, vocab=512)
    prompts = write_prompts(tmp_path / "long.jsonl", 8, seed=3, min_words=800, max_words=1000)
    out = tmp_path / "generations.jsonl"
    spec_path = gw.write_spec(
        "oom-infer",
        f"""
        name: oom-infer
        kind: infer
        env: {{OMP_NUM_THREADS: "1", MALLOC_ARENA_MAX: "2"}}
        resources: {{gpus: 0, memory_limit: 1.6GiB}}
        infer:
          task: generate
          model: {model}
          input: {prompts}
          output: {out}
          batch_size: 8
          max_new_tokens: 2
          max_input_length: 1024
          attn_implementation: eager
        """,
    )
    result = gw.cli("run", str(spec_path), "--follow", timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    detail = gw.cli_json("show", "oom-infer")
    assert detail["state"] == "succeeded"
    assert detail["retunes"][0]["verdict"] == "host_oom"
    assert detail["retunes"][0]["to"]["infer.batch_size"] < 8
    # Its sizes were measured in one probe process, which imported torch and transformers once.
    evidence = detail["retunes"][0]["evidence"]
    sizes = len(evidence["probes"])
    assert sizes >= 1 and evidence["decided"] == f"1 probe process, {sizes} size{'s' if sizes > 1 else ''}"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [r["id"] for r in rows]
    expected = [json.loads(line).get("id", i) for i, line in enumerate(prompts.read_text().splitlines())]
    assert sorted(map(str, ids)) == sorted(map(str, expected))  # every item exactly once
    assert len(ids) == len(set(ids)) == 8


def test_command_run_oom_text_is_classified_and_its_templated_argument_changed(gw: DaemonHandle) -> None:
    program = textwrap.dedent(
        """
        import sys
        batch = int(sys.argv[1])
        if batch > 8:
            sys.stderr.write(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
                "total capacity of 79.10 GiB of which 1.02 GiB is free. Including non-PyTorch memory, "
                "this process has 77.00 GiB memory in use.\\n"
            )
            sys.exit(1)
        print("ran with batch", batch)
        """
    )
    spec = {
        "name": "cmd-oom",
        "kind": "command",
        "command": {
            "argv": [sys.executable, "-c", program.replace("{", "{{").replace("}", "}}"), "{batch_size}"]
        },
        "knobs": {"batch_size": 32},
        "resources": {"gpus": 1},
    }
    run = gw.submit(spec)
    final = gw.wait_state(run["id"], timeout=60)
    assert final["state"] == "succeeded", final["message"]
    detail = gw.cli_json("show", run["id"])
    assert [r["verdict"] for r in detail["retunes"]] == ["gpu_capacity"] * len(detail["retunes"])
    assert detail["retunes"][0]["from"] == {"knobs.batch_size": 32}
    last = detail["retunes"][-1]["to"]["knobs.batch_size"]
    assert last <= 8
    logs = gw.cli("logs", run["id"])
    assert f"ran with batch {last}" in logs.stdout


def test_a_shape_bug_fails_with_the_reason_instead_of_retrying(gw: DaemonHandle) -> None:
    program = (
        "import sys; sys.stderr.write('CUDA out of memory. Tried to allocate 7178.00 GiB. GPU 0 has a total "
        "capacity of 79.10 GiB of which 70.00 GiB is free.\\n'); sys.exit(1)"
    )
    spec: dict[str, Any] = {
        "name": "shape-bug",
        "kind": "command",
        "command": {"argv": [sys.executable, "-c", program]},
        "knobs": {"batch_size": 4},
        "resources": {"gpus": 1},
    }
    run = gw.submit(spec)
    final = gw.wait_state(run["id"], timeout=30)
    assert final["state"] == "failed"
    assert "shape_bug" in final["message"]
    assert gw.cli_json("show", run["id"])["retunes"] == []
