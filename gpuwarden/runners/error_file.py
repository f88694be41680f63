"""A rank's own failure, in the error file torchrun gave it (`TORCHELASTIC_ERROR_FILE`).

torchrun reads the file of each failed rank for its failure summary and copies the first one to
its own error file (in the attempt directory, see `gpuwarden.core.gang.files`), so the summary
names the real cause ("out of memory in forward…") instead of "exit code 3". The format is
torchrun's (`{"message": {"message": …, "extraInfo": {"py_callstack": …, "timestamp": …}}}`),
plus our fields: `rank`, `exitcode` and the `event` itself. Ranks stopped because
another failed write nothing here: they are not the cause.
"""

from __future__ import annotations

import json
import os
import sys
import time

from gpuwarden.core.events import Event

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


def write_error_file(failure: Event | None, status: int, rank: int) -> None:
    """Record `failure` (the rank's last `oom`/`error` event) and its exit status, if torchrun
    asked for a file; a write error is reported on stderr and otherwise ignored."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    fields = failure.model_dump(mode="json", exclude_none=True) if failure is not None else {}
    kind = fields.get("verdict") or fields.get("code") or "failed"
    text = str(fields.get("message") or f"exit status {status}")
    message = f"rank {rank}: {fields.get('type', 'error')} ({kind}): {text}"
    now = time.time()
    record = {
        # torchrun's own layout, so that its failure summary shows the message
        "message": {"message": message, "extraInfo": {"py_callstack": message, "timestamp": str(int(now))}},
        "rank": rank,
        "exitcode": status,
        "event": fields or None,
    }
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(record, fh)
    except OSError as exc:
        print(f"gpuwarden: cannot write the error file {path}: {exc}", file=sys.stderr, flush=True)
