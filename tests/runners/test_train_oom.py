"""A real out-of-memory, end to end: an address-space limit on the runner process makes torch's
CPU allocator fail for real; the runner checkpoints, reports `oom` and exits 3; a second attempt
with a quarter of the micro-batch and four times the accumulation resumes and finishes. The
texts are packed (`packing: true`): the finished run's token count shows every block full."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.events import EXIT_OK, EXIT_OOM
from gpuwarden.runners.testing_models import build_tiny_causal_lm, write_text_dataset
from tests.runners.conftest import run_attempt

# The runner maps ~0.8 GB of address space by importing torch and transformers. Logits of a
# 32000-word vocabulary at 256 tokens cost ~33 MB per sample and are copied a few times in the
# loss: micro-batch 16 needs ~2 GB more, micro-batch 4 about 0.5 GB.
LIMIT = 2 << 30


@pytest.fixture(scope="module")
def wide_vocab_lm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("oom-assets")
    return {
        "model": build_tiny_causal_lm(root / "wide-vocab", hidden=64, layers=1, vocab=32000, seed=0),
        "texts": write_text_dataset(root / "texts.jsonl", 200, seed=5),
    }


def section(assets: dict[str, Path], batch_size: int, grad_accum_steps: int) -> dict[str, Any]:
    return {
        "task": "causal_lm",
        "model": str(assets["model"]),
        "data": str(assets["texts"]),
        "max_length": 256,
        "packing": True,
        "batch_size": batch_size,
        "grad_accum_steps": grad_accum_steps,
        "max_steps": 1,
        "log_interval": 1,
    }


@pytest.mark.slow
def test_real_cpu_oom_checkpoints_and_a_smaller_micro_batch_resumes(
    wide_vocab_lm: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # few malloc arenas (and, as for every runner here, one thread): the reserved address space
    # must not grow with the cores
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    run_dir = tmp_path / "run"

    first = run_attempt(section(wide_vocab_lm, 16, 1), run_dir, attempt=1, limit=LIMIT)
    assert first.rc == EXIT_OOM, first.stderr
    oom = first.one("oom")
    assert oom["verdict"] == "host_oom", oom
    assert "DefaultCPUAllocator" in oom["message"]
    assert oom["phase"] in ("forward", "backward") and oom["batch_size"] == 16 and oom["step"] == 0
    assert oom["fields"].get("requested", 0) > 0
    assert oom["checkpoint"] and Path(oom["checkpoint"], "meta.json").is_file()
    ckpt = first.one("checkpoint")
    assert ckpt["reason"] == "oom" and ckpt["path"] == oom["checkpoint"] and ckpt["samples_seen"] == 0
    assert "Traceback" not in first.stderr and not first.of_type("finished")

    second = run_attempt(section(wide_vocab_lm, 4, 4), run_dir, attempt=2, limit=LIMIT)
    assert second.rc == EXIT_OK, second.stderr
    assert second.one("started")["resumed_from"] == oom["checkpoint"]
    report = second.one("finished")["report"]
    # packed blocks have no padding: every sample is exactly max_length tokens
    assert report["steps"] == 1 and report["samples_seen"] == 16 and report["tokens_seen"] == 16 * 256
    assert report["batch_size"] == 4 and report["effective_batch"] == 16
