"""The line that opens an attempt's output where a run's attempts are shown one after another
(`gpuwarden logs -f`, the dashboard's Log tab): what the attempt was started with, as the retune
or the restart before it says.

  ── attempt 2: micro-batch 32 → 8, accumulation 1 → 4, effective batch 32 kept ──
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuwarden.core.api import Attempt, Retune
from gpuwarden.core.oom.explain import change_text


def attempt_heading(
    number: int, attempts: Sequence[Attempt], retunes: Sequence[Retune], world_size: int = 1
) -> str:
    """`── attempt N ──`, with what changed since the attempt before it where something did."""
    return f"── attempt {number}{_why(number, attempts, retunes, world_size)} ──"


def _why(number: int, attempts: Sequence[Attempt], retunes: Sequence[Retune], world_size: int) -> str:
    retune = next((r for r in reversed(retunes) if r.attempt == number - 1), None)
    if retune is not None:
        return f": {change_text(retune, world_size)}"
    before = next((a for a in attempts if a.attempt == number - 1), None)
    if before is not None and before.restart is not None:
        restart = before.restart
        return f": restart {restart.restart} of {restart.max} after {restart.cause}"
    return ""
