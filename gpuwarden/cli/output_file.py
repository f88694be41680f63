"""A file a command is about to write (a tuned or a fixed spec): refused before the work that
produces it, so minutes of probing are not lost to a typo in `-o`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpuwarden.core.errors import UserError


def check_writable(out: Path) -> None:
    """One line naming the problem when `out` cannot be written as a file."""
    if out.is_dir():
        raise UserError(f"{out} is a folder — give a file name, e.g. {out / 'tuned.yaml'}")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{out}: the folder {parent} does not exist — create it or choose another path")
    if not os.access(parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise UserError(f"{out}: cannot write there (permission denied) — choose another path")


@contextmanager
def writing(out: Path) -> Iterator[None]:
    """Around the write of `out`: a failure the checks could not foresee (a full disk) is one line."""
    try:
        yield
    except OSError as exc:
        raise UserError(f"{out}: cannot write ({exc.strerror}) — check the path") from None
