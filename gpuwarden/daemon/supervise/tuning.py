"""`autotune: true`: probe for the batch size on the run's own GPUs (held for it) before its
first attempt, off the loop; the tuned spec comes back to the loop, which starts the attempt."""

from __future__ import annotations

import logging
from pathlib import Path

from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.errors import one_line
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.supervise.context import Context, Start, spec_document
from gpuwarden.daemon.supervise.hooks import AutotuneHook

log = logging.getLogger("gpuwarden.daemon.supervisor")


def begin(ctx: Context, start: Start, hook: AutotuneHook) -> None:
    run_id = str(start.run["id"])
    where = ", ".join(start.placement.gpus) or "the CPU"
    ctx.set_state(run_id, RunState.STARTING, f"autotune: probing micro-batch sizes on {where}")
    ctx.held[run_id] = list(start.placement.gpus)
    run_dir = Path(start.run["run_dir"])

    def work() -> None:
        tuned, line = tune(run_id, start.spec, start.placement.gpus, run_dir, hook)
        ctx.hand_back(run_id, lambda: apply(ctx, start, tuned, line))

    ctx.backends.start_thread(f"autotune-{run_id}", work)


def tune(
    run_id: str, spec: RunSpec, gpus: list[str], run_dir: Path, hook: AutotuneHook
) -> tuple[RunSpec, str]:
    """The tuned spec and a line saying how; a failed tune must not cost the run: it starts as
    written."""
    try:
        document, line = hook(spec, gpus, run_dir)
        return spec_from_mapping(document), line
    except Exception as exc:
        log.warning("autotune failed for run %s: %s", run_id, exc)
        line = f"autotune failed ({one_line(exc)}); starting with the spec's own values"
        return spec.model_copy(update={"autotune": False}), line


def apply(ctx: Context, start: Start, tuned: RunSpec, line: str) -> Start | None:
    """Record the tuned spec; the GPUs stay held until it is (a refused write is applied again)."""
    run_id = str(start.run["id"])
    if ctx.state_of(run_id) is not RunState.STARTING:
        ctx.held.pop(run_id, None)
        return None  # stopped or deleted while probing
    recorded = ctx.batch().write(lambda s: s.update_run(run_id, spec=spec_document(tuned)))
    recorded.event(run_id, None, "autotuned", message=line).commit()
    ctx.held.pop(run_id, None)
    return Start(ctx.run(run_id), tuned, start.placement)
