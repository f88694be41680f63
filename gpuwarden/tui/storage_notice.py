"""The toast for the daemon's store: one with the whole fault when it starts (the top line keeps
a cut one while it lasts), and one when it is over."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpuwarden.tui.session_log import LOG


@dataclass(frozen=True)
class Notice:
    message: str
    title: str
    severity: Literal["information", "warning"]
    timeout: float


def storage_notice(was: str | None, fault: str | None) -> Notice | None:
    """What to tell when the store's fault went from `was` to `fault` (None: nothing changed)."""
    if fault == was:
        return None
    if fault is None:
        LOG.info("the daemon can write its store again")
        return Notice("the daemon can write its store again", "storage", "information", 5)
    LOG.warning("the daemon reports: %s", fault)
    return Notice(
        f"{fault}\nRuns go on; new runs wait and samples may be dropped until it is fixed.",
        "the daemon cannot write its store",
        "warning",
        15,
    )
