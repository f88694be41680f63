"""`gpuwarden report` and `compare` of inference runs as a user runs them: every token an attempt
produced, its first batch's included, as for its samples (for gpuwarden's inference runner and
for a user's script); rates of a run that reported once; items compared with samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwarden.runners.infer.example_models import write_prompts
from gpuwarden.runners.testing_models import build_tiny_causal_lm
from tests.daemon.conftest import DaemonHandle, command_spec

pytestmark = pytest.mark.slow


def _generation(
    tmp_path: Path, name: str, prompts: int, batch_size: int, new_tokens: int
) -> dict[str, object]:
    """The spec of a generation run over `prompts` prompts with a tiny model built here."""
    infer = {
        "task": "generate",
        "model": str(build_tiny_causal_lm(tmp_path / "tiny-llm")),
        "input": str(write_prompts(tmp_path / "prompts.jsonl", prompts, seed=0, max_words=8)),
        "batch_size": batch_size,
        "max_new_tokens": new_tokens,
    }
    return {"name": name, "kind": "infer", "resources": {"gpus": 0}, "infer": infer}


def _report(gw: DaemonHandle, run_id: str) -> dict[str, object]:
    throughput: dict[str, object] = gw.cli_json("report", run_id)["throughput"]
    return throughput


def test_generation_report_counts_the_tokens_of_every_batch(gw: DaemonHandle, tmp_path: Path) -> None:
    spec = _generation(tmp_path, "generate-tokens", 12, batch_size=4, new_tokens=8)
    run = gw.wait_state(gw.submit(spec)["id"], timeout=180)
    assert run["state"] == "succeeded", run["message"]
    written = json.loads(Path(run["run_dir"], "report.json").read_text())

    throughput = _report(gw, run["id"])
    assert throughput["samples"] == 12
    assert throughput["tokens"] == written["tokens_out"]  # three batches' tokens, not the last two's


def test_a_generation_done_in_one_batch_has_its_token_rate(gw: DaemonHandle, tmp_path: Path) -> None:
    spec = _generation(tmp_path, "one-batch", 4, batch_size=4, new_tokens=8)
    run = gw.wait_state(gw.submit(spec)["id"], timeout=180)
    assert run["state"] == "succeeded", run["message"]
    written = json.loads(Path(run["run_dir"], "report.json").read_text())

    throughput = _report(gw, run["id"])  # one progress event: no interval of its own
    assert throughput["source"] == "finished report"
    assert throughput["samples_per_s"] == written["items_per_s"]
    assert throughput["tokens_per_s"] == written["tokens_per_s"]


def test_a_scripts_report_counts_the_tokens_of_its_first_step(gw: DaemonHandle) -> None:
    code = """
        from gpuwarden import sdk
        for step in (1, 2):
            sdk.progress(step, 10 * step, tokens_seen=100 * step, batch_size=10)
    """
    spec = command_spec("script-tokens", code, resources={"gpus": 0})
    run = gw.wait_state(gw.submit(spec)["id"])
    assert run["state"] == "succeeded", run["message"]

    throughput = _report(gw, run["id"])
    assert throughput["samples"] == 20
    assert throughput["tokens"] == 200


def test_comparing_an_inference_run_with_a_training_run_says_their_units_differ(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    generated = gw.submit(_generation(tmp_path, "gen", 4, batch_size=2, new_tokens=4))
    code = """
        from gpuwarden import sdk
        for step in (1, 2):
            sdk.progress(step, 10 * step, batch_size=10)
    """
    trained = gw.submit(command_spec("script", code, resources={"gpus": 0}))
    for run in (generated, trained):
        assert gw.wait_state(run["id"], timeout=180)["state"] == "succeeded"

    compared = gw.cli_json("compare", generated["id"], trained["id"])
    assert compared["notes"] == ["A counts items, B samples: the per-second rows compare different units"]
    text = gw.cli("compare", generated["id"], trained["id"]).stdout
    assert "A counts items, B samples" in text and "units/s (loop)" in text
