"""`run --follow` and `logs -f` print a run's stdout and stderr, two files read one after the
other: what the program wrote to one while the other was read keeps its order."""

from __future__ import annotations

import io
import sys

import pytest

from gpuwarden.cli.runs_cmds import print_attempts_output
from gpuwarden.core.api import LogChunk


class WritesWhileRead:
    """An attempt's two logs, whose program prints a line and then its traceback just when the
    follower has found stdout empty and turns to stderr."""

    def __init__(self) -> None:
        self.files = {"stdout": "", "stderr": ""}
        self.written = False

    def logs(
        self,
        ref: str,
        stream: str = "stdout",
        attempt: int | None = None,
        offset: int | None = None,
        limit: int = 65536,
        wait: float = 0.0,
    ) -> LogChunk:
        if stream == "stderr" and not self.written:
            self.files["stdout"] += "starting at batch 16\n"
            self.files["stderr"] += "torch.OutOfMemoryError: CUDA out of memory.\n"
            self.written = True
        start = offset or 0
        data = self.files[stream][start : start + limit]
        return LogChunk(
            data=data,
            offset=start,
            next_offset=start + len(data),
            overflow=False,
            size=len(self.files[stream]),
            modified=100.0,  # one clock tick: the files' times cannot tell which came first
            eof=False,
            attempt=attempt or 1,
            stream="stderr" if stream == "stderr" else "stdout",
        )


def test_a_line_printed_while_the_other_stream_was_read_comes_before_what_followed_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    print_attempts_output(WritesWhileRead(), "r1", [1], {}, as_json=False)
    assert terminal.getvalue() == "starting at batch 16\ntorch.OutOfMemoryError: CUDA out of memory.\n"
