"""The probes of a retune: one process per size against one probe process for every size.

The shipped example (`configs/examples/oom-recovery-cpu.yaml`: micro-batch 32 under a 1.4 GiB
address-space limit) ran out of memory; the retune probes 4 × 8, then 16 × 2, each resuming the
run's checkpoint and writing one, as the daemon's retune does. Measured: the retune's seconds
from the OOM to its decision, and the probe processes it started, interleaved round by round.
Target: 1 probe process for the session.

CPU only (what this machine has); the limit makes torch's allocator fail for real.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.figures import REPEATS, figure_row, main_for
from gpuwarden.core.checkpoints import find_latest_checkpoint
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.oom.recovery import AttemptFacts, plan_recovery
from gpuwarden.core.rlimit import limited_argv
from gpuwarden.core.tune.probe import SubprocessProber
from gpuwarden.core.tune.search import Candidate

EXAMPLE = Path(__file__).resolve().parent.parent / "configs" / "examples" / "oom-recovery-cpu.yaml"
LIMIT = int(1.4 * 2**30)
OOM = {"type": "oom", "attempt": 1, "source": "runner", "verdict": "host_oom", "batch_size": 32, "step": 0}


def _checkpoint(work: Path, doc: dict[str, Any]) -> Path:
    """The run's checkpoint the probes resume: one step at 4 × 8."""
    run = work / "run"
    run.mkdir()
    seed = {**doc, "train": {**doc["train"], "batch_size": 4, "grad_accum_steps": 8, "max_steps": 1}}
    (run / "spec.yaml").write_text(yaml.safe_dump(seed))
    argv = [
        sys.executable,
        "-m",
        "gpuwarden.runners",
        "--spec",
        str(run / "spec.yaml"),
        "--run-dir",
        str(run),
    ]
    subprocess.run(limited_argv(argv, 2 * LIMIT), env={**os.environ, **doc["env"]}, check=True, timeout=600)
    found = find_latest_checkpoint(run / "checkpoints")
    assert found is not None
    return found


def _retune(work: Path, spec: RunSpec, checkpoint: Path, session: bool) -> tuple[float, int, str]:
    """(seconds from the OOM to the decision, probe processes, the evidence's sentence)."""
    env = {**os.environ, **spec.env}
    prober = SubprocessProber(
        spec, work, env=env, warmup_steps=1, measure_steps=1, resume_from=checkpoint, include_saves=True,
        session=session,
    )  # fmt: skip

    def probe(batch: int) -> tuple[int | None, bool]:
        result = prober(Candidate(batch, 32 // batch, "auto", False))
        return result.mem_peak, result.oom

    facts = AttemptFacts(number=1, events=[OOM], exit_code=3, host_capacity=LIMIT)
    start = time.perf_counter()
    try:
        plan = plan_recovery(
            spec, facts, history=[], retunes_so_far=0, elapsed_s=0, probe=probe,
            probe_processes=lambda: prober.processes,
        )  # fmt: skip
    finally:
        prober.close()
    return time.perf_counter() - start, prober.processes, str(plan.decided)


def run() -> list[dict[str, Any]]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    spec = spec_from_mapping(doc)
    work = Path(tempfile.mkdtemp(prefix="bench-probe-session-"))
    found: dict[bool, list[tuple[float, int, str]]] = {False: [], True: []}
    try:
        checkpoint = _checkpoint(work, doc)
        for n in range(REPEATS):
            for session in (False, True):
                found[session].append(_retune(work / f"{n}-{session}", spec, checkpoint, session))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for session, name in ((False, "one process per size"), (True, "one probe process")):
        said = found[session][-1][2]
        rows.append(
            figure_row(
                f"retune's probes, {name}: OOM → decision ({said})", [r[0] for r in found[session]], "s"
            )
        )
        rows.append(
            figure_row(
                f"  {name}: probe processes",
                [r[1] for r in found[session]],
                "processes",
                target="1" if session else "",
                check=(lambda v: v == 1) if session else None,
            )
        )
    return rows


if __name__ == "__main__":
    raise SystemExit(main_for(run))
