"""User errors end as one `error` event, exit status 2 and no traceback; warnings do not stop runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.events import EXIT_OK, EXIT_USER_ERROR
from gpuwarden.runners.__main__ import run_body
from gpuwarden.runners.device import resolve_precision
from gpuwarden.runners.events import EventWriter
from gpuwarden.runners.train.main import precision_warning
from tests.runners.conftest import RunResult, RunRunner, read_events, write_spec
from tests.runners.test_train_image import image_section


def assert_user_error(result: RunResult, code: str, *needles: str) -> str:
    assert result.rc == EXIT_USER_ERROR, result.stderr
    error = result.one("error")
    assert error["code"] == code, error
    assert "\n" not in error["message"]
    for needle in needles:
        assert needle in error["message"], error["message"]
    assert "Traceback" not in result.stderr
    assert not result.of_type("finished")
    message: str = error["message"]
    return message


def test_missing_model_directory(run_runner: RunRunner, assets: dict[str, Path], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    result = run_runner({"task": "causal_lm", "model": str(missing), "data": str(assets["texts"])})
    assert_user_error(result, "missing_model", str(missing))


def test_unreadable_text_data(run_runner: RunRunner, assets: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": oops}\n', encoding="utf-8")
    result = run_runner({"task": "causal_lm", "model": str(assets["lm"]), "data": str(bad)})
    assert_user_error(result, "bad_data", f"{bad}:2")


def test_unreadable_image_names_the_file(
    run_runner: RunRunner, image_assets: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    for src in sorted(image_assets["images"].glob("*.png"))[:3]:
        (folder / src.name).write_bytes(src.read_bytes())
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    result = run_runner(image_section(data=str(folder)))
    assert_user_error(result, "bad_data", "broken.png")


def run_in_process(train: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> RunResult:
    """One attempt through the runner's own `run_body`, in this process: for a request refused
    before any model or data is touched, the same code makes the event, the message and the exit
    status as in a runner process (the tests above start one), without the torch start-up."""
    run_dir = tmp_path / "run"
    events_path = run_dir / "attempts" / "1" / "events.jsonl"
    with EventWriter(events_path) as events:
        rc = run_body(write_spec(tmp_path / "spec.yaml", train), run_dir, 1, events)
    captured = capsys.readouterr()
    return RunResult(rc, captured.out, captured.err, run_dir, read_events(events_path))


@pytest.mark.parametrize(
    ("spec", "code", "needle"),
    [
        ({"precision": "fp16"}, "unsupported", "fp16 needs a CUDA GPU"),
        ({"world_size": 2}, "unsupported", "world_size 2"),
        ({"batch_sise": 4}, "invalid_config", "did you mean 'batch_size'"),
    ],
)
def test_impossible_requests_are_user_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: dict[str, Any], code: str, needle: str
) -> None:
    result = run_in_process(image_section(**spec), tmp_path, capsys)
    message = assert_user_error(result, code, needle)
    assert result.stderr == f"gpuwarden: {message}\n"


@pytest.mark.slow
def test_bf16_on_cpu_warns_and_runs(run_runner: RunRunner) -> None:
    result = run_runner(image_section(precision="bf16", max_steps=2, log_interval=1))
    assert result.rc == EXIT_OK, result.stderr
    warning = result.one("warning")
    assert warning["code"] == "precision_slow" and warning["used"] == "bf16"
    assert result.one("started")["dtype"] == "bf16"


def test_legacy_amp_switch_says_it_runs_fp32_on_cpu() -> None:
    # Which warning `amp: true` gets; the runner emits it by the same line as bf16's above, whose
    # run shows it reaching the events without stopping the run.
    spec = spec_from_mapping({"version": 1, "name": "amp", "kind": "train", "train": image_section(amp=True)})
    assert spec.train is not None
    precision = resolve_precision(spec.train.resolved_precision_request(), torch.device("cpu"))
    warning = precision_warning(spec.train, precision)
    assert precision.used == "fp32"
    assert warning is not None and (warning.code, warning.used) == ("precision_unavailable", "fp32")
