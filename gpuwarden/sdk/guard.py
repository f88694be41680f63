"""The OOM guard: an out-of-memory inside it becomes checkpoint + `oom` event + exit status 3.

Classified by gpuwarden's own classifier (the exception chain, then the allocator's numbers), so
the script and the daemon agree on what happened. Before saving, the frames the exception holds
are cleared and garbage collected: they keep the failed step's activations alive, and the save
needs that memory. Anything that is not an out-of-memory passes through untouched, and outside
gpuwarden the guard changes nothing at all.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import traceback
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from gpuwarden.sdk.reporter import Reporter, default_reporter

# The protocol's exit status for "out of memory, an `oom` event says how" (docs/events.md).
EXIT_OOM = 3

SaveFn = Callable[[], "str | None"]


def report_oom(
    exc: BaseException,
    *,
    reporter: Reporter,
    save: SaveFn | None = None,
    consistent: bool = True,
    batch_size: int | None = None,
    step: int | None = None,
    samples_seen: int | None = None,
    phase: str | None = None,
) -> bool:
    """When `exc` is an out-of-memory: save (if the state is consistent), write the `checkpoint`
    and `oom` events, and return True. False for anything else (nothing written)."""
    from gpuwarden.core.oom.classify import classify_exception

    verdict = classify_exception(exc)
    if not verdict.is_oom:
        return False
    path: str | None = None
    if save is not None and consistent and verdict.verdict != "shape_bug":
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)
        gc.collect()
        try:
            path = save()
        except Exception as save_error:  # a save that fails too must not hide the OOM
            print(f"gpuwarden: checkpoint at the OOM failed: {save_error}", file=sys.stderr, flush=True)
            path = None
        if path and step is not None:
            reporter.checkpoint(path, step, samples_seen or 0, reason="oom")
    reporter.emit(
        "oom",
        verdict=verdict.verdict,
        message=verdict.message,
        fields=dict(verdict.fields),
        phase=phase,
        batch_size=batch_size,
        step=step,
        checkpoint=path,
    )
    reporter.sync()
    return True


class OomGuard:
    """`with oom_guard(save=...) as guard:` — keep `guard.step` (optimizer steps done),
    `guard.samples_seen` and `guard.batch_size` current, and wrap the optimizer's update in
    `with guard.updating():`: the one window in which weights and optimizer state disagree, so
    no checkpoint is taken there."""

    def __init__(
        self,
        save: SaveFn | None = None,
        *,
        batch_size: int | None = None,
        reporter: Reporter | None = None,
        exit: Callable[[int], Any] = sys.exit,
    ) -> None:
        self.save = save
        self.batch_size = batch_size
        self.step: int | None = None
        self.samples_seen: int | None = None
        self.reporter = reporter or default_reporter()
        self._updating = False
        self._exit = exit

    @contextlib.contextmanager
    def updating(self) -> Iterator[None]:
        self._updating = True
        try:
            yield
        finally:
            self._updating = False

    def __enter__(self) -> OomGuard:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if exc is None or not self.reporter.active or not isinstance(exc, Exception):
            return False
        handled = report_oom(
            exc,
            reporter=self.reporter,
            save=self.save,
            consistent=not self._updating,
            batch_size=self.batch_size,
            step=self.step,
            samples_seen=self.samples_seen,
        )
        if not handled:
            return False
        print(
            f"gpuwarden: out of memory ({type(exc).__name__}); exiting {EXIT_OOM} for a retune",
            file=sys.stderr,
        )
        self._exit(EXIT_OOM)
        return True


def oom_guard(
    save: SaveFn | None = None, *, batch_size: int | None = None, reporter: Reporter | None = None
) -> OomGuard:
    """An OomGuard (see its docstring); `save()` writes a checkpoint and returns its path."""
    return OomGuard(save, batch_size=batch_size, reporter=reporter)
