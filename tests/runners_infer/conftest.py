"""Fixtures for the inference runner tests: tiny models and inputs built once per session, and a
helper that runs `python -m gpuwarden.runners` as a real subprocess (optionally under an
address-space limit) and parses the events it wrote."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.core.events import decode
from gpuwarden.runners.infer.example_models import (
    build_tiny_chat_vlm,
    build_tiny_vlm,
    write_images,
    write_prompts,
)
from gpuwarden.runners.testing_models import build_tiny_causal_lm

REPO = Path(__file__).resolve().parents[2]
# One compute thread per runner (the tokenizer's pool included): the suite runs a worker per core,
# and on a busy core torch's second OpenMP thread spins waiting for its partner, costing CPU for
# nothing.
PINNED_THREADS = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class RunResult:
    """What one runner process left behind."""

    rc: int
    stderr: str
    run_dir: Path
    events: list[dict[str, Any]]
    seconds: float

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.of_type(kind)
        assert len(found) == 1, f"expected one {kind} event, got {len(found)}: {self.events}\n{self.stderr}"
        return found[0]

    def warnings(self, code: str) -> list[dict[str, Any]]:
        return [e for e in self.of_type("warning") if e["code"] == code]


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every line of an events file, decoded; a line that does not decode fails the test."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        event = decode(line)
        assert event is not None, f"undecodable event line: {line!r}"
        events.append(event)
    return events


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL output; the file must end with a newline (no partial line)."""
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n"), f"{path} ends with a partial line"
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write_spec(path: Path, infer: dict[str, Any], *, name: str = "infer-test") -> Path:
    """An infer RunSpec on the CPU with `infer` as its section (paths as strings)."""
    section = {k: str(v) if isinstance(v, Path) else v for k, v in infer.items()}
    spec = {"version": 1, "name": name, "kind": "infer", "resources": {"gpus": 0}, "infer": section}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


def _limit_address_space(limit: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def start_runner(
    spec: Path,
    run_dir: Path,
    *,
    attempt: int,
    limit_as: int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """Start `python -m gpuwarden.runners` for `spec` (stdout/stderr to files in the run dir),
    with `env` added to this process's environment."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / f"stderr-{attempt}.log"
    # The child keeps its own descriptor; the parent's copy is closed as soon as it has started.
    with open(log, "w", encoding="utf-8") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuwarden.runners",
                "--spec",
                str(spec),
                "--run-dir",
                str(run_dir),
                "--attempt",
                str(attempt),
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
            preexec_fn=_limit_address_space(limit_as) if limit_as else None,
            env={**os.environ, **PINNED_THREADS, **(env or {})},
        )


def finish(
    proc: subprocess.Popen[str], run_dir: Path, attempt: int, started: float, timeout: float = 240
) -> RunResult:
    """Wait for `proc` and collect its events and stderr."""
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        raise
    stderr = (run_dir / f"stderr-{attempt}.log").read_text(encoding="utf-8")
    events = read_events(run_dir / "attempts" / str(attempt) / "events.jsonl")
    return RunResult(rc, stderr, run_dir, events, time.monotonic() - started)


@pytest.fixture
def run_runner() -> Callable[..., RunResult]:
    """Run one attempt to completion: run_runner(spec, run_dir, attempt=1, limit_as=None)."""

    def run(spec: Path, run_dir: Path, *, attempt: int = 1, limit_as: int | None = None) -> RunResult:
        started = time.monotonic()
        proc = start_runner(spec, run_dir, attempt=attempt, limit_as=limit_as)
        return finish(proc, run_dir, attempt, started)

    return run


@pytest.fixture(scope="session")
def lm_assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny causal LM and 24 prompts, built once (a second or two)."""
    root = tmp_path_factory.mktemp("infer-lm")
    return {
        "llm": build_tiny_causal_lm(root / "tiny-llm", hidden=64, layers=2, vocab=512),
        "prompts": write_prompts(root / "prompts.jsonl", 24, seed=7),
    }


@pytest.fixture(scope="session")
def vlm_assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny VLMs (encoder-decoder and chat) and 6 images, built once (a second or two)."""
    root = tmp_path_factory.mktemp("infer-vlm")
    return {
        "vlm": build_tiny_vlm(root / "tiny-vlm"),
        "chat_vlm": build_tiny_chat_vlm(root / "tiny-chat-vlm"),
        "images": write_images(root / "pages", 6, seed=5),
    }


@pytest.fixture(scope="session")
def oom_assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A model and prompts whose eager attention needs ~200 MB per item at 1024 tokens.

    16 heads × 1024² scores × 4 bytes = 64 MiB per item per tensor, and eager attention holds
    about three such tensors (scores, masked scores, softmax), so batch 8 asks for ~1.5 GB more
    than batch 1 — a clear gap for an address-space limit to fall into.
    """
    root = tmp_path_factory.mktemp("infer-oom")
    return {
        "llm": build_tiny_causal_lm(root / "wide-llm", hidden=256, layers=1, vocab=512),
        "prompts": write_prompts(root / "long.jsonl", 8, seed=3, min_words=800, max_words=1000),
    }
