"""One probe process measures several micro-batches: it loads the model once, runs each size in a
fork of itself, reports each size's own peak, and survives a size that runs out of memory."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.events import EXIT_USER_ERROR
from gpuwarden.core.tune.probe import SubprocessProber
from gpuwarden.core.tune.search import Candidate
from gpuwarden.runners.probe_session import TaskCache, serve

PINNED = {"OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}
# Micro-batch 64 of this CNN needs about 1.1 GB of address space, 2 about 0.74 GB: under 0.95 GB
# the first runs out of memory for real (torch's CPU allocator under RLIMIT_AS), the second fits.
LIMIT = int(0.95 * 10**9)
SPEC: dict[str, Any] = {
    "name": "session",
    "kind": "train",
    "env": PINNED,
    "resources": {"gpus": 0, "memory_limit": LIMIT},
    "train": {
        "task": "image",
        "batch_size": 64,
        "max_steps": 1,
        "log_interval": 1,
        "image": {"base_channels": 16, "num_blocks": 2, "patch_size": 96, "synthetic_samples": 64},
    },
}


def _prober(work: Path, *, session: bool) -> SubprocessProber:
    spec = spec_from_mapping(SPEC)
    env = {**os.environ, **PINNED}
    return SubprocessProber(spec, work, env=env, warmup_steps=1, measure_steps=1, session=session)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_one_process_measures_each_size_s_own_peak_after_a_real_oom(tmp_path: Path) -> None:
    session = _prober(tmp_path / "session", session=True)
    try:
        big = session(Candidate(64, 1, "auto", False))
        small = session(Candidate(2, 1, "auto", False))
    finally:
        session.close()
    assert big.oom and not big.ok  # reported as "does not fit", and the process went on
    assert small.ok and small.mem_peak is not None
    assert session.processes == 1

    fresh = _prober(tmp_path / "fresh", session=False)
    alone = fresh(Candidate(2, 1, "auto", False))
    assert fresh.processes == 1 and alone.ok and alone.mem_peak is not None
    # One process's VmPeak never falls: measured in it after 64 ran into the limit, size 2 would
    # read close to the limit. Its own peak is what a fresh process at size 2 reaches.
    assert abs(small.mem_peak - alone.mem_peak) < 0.08 * alone.mem_peak, (small.mem_peak, alone.mem_peak)
    assert small.mem_peak < 0.85 * LIMIT


def test_a_request_that_is_not_json_gets_one_line_and_the_process_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    replies = io.StringIO()
    status = serve(io.StringIO("not json\n\n"), replies)
    assert status == 0
    assert [json.loads(line) for line in replies.getvalue().splitlines()] == [{"status": EXIT_USER_ERROR}]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpuwarden: probe session: a request must be JSON")


def test_sizes_of_one_task_share_the_built_model(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []

    def prepare(spec: Any) -> object:
        built.append(spec.train.batch_size)
        return object()

    monkeypatch.setattr("gpuwarden.runners.train.main.prepare_task", prepare)
    tasks = TaskCache()
    first = tasks(spec_from_mapping(SPEC))
    again = tasks(spec_from_mapping({**SPEC, "train": {**SPEC["train"], "batch_size": 8}}))
    other = {**SPEC["train"], "image": {**SPEC["train"]["image"], "patch_size": 64}}
    third = tasks(spec_from_mapping({**SPEC, "train": other}))
    assert first is again and third is not first and built == [64, 64]
