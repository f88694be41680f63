"""The daemon's own entry (`python -m gpuwarden daemon`), run with a look inside it: `--after`
seconds after it started serving it writes what makes up its memory to `--out` (JSON) and stops itself.

What it writes: RSS, the modules imported (count, and by top-level package), the top allocations
still held (tracemalloc, by line, when `--trace` is given: tracing costs memory of its own, so
RSS is measured without it), and the threads with their stack size. `bench_daemon_memory` runs it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any


def inventory(trace: bool) -> dict[str, Any]:
    """What the process holds now."""
    import psutil

    packages = collections.Counter(name.partition(".")[0] for name in list(sys.modules))
    out: dict[str, Any] = {
        "rss": psutil.Process().memory_info().rss,
        "modules": len(sys.modules),
        "packages": dict(packages.most_common()),
        "threads": [t.name for t in threading.enumerate()],
        "stack_size": threading.stack_size(),
    }
    if trace:
        stats = tracemalloc.take_snapshot().statistics("lineno")
        out["traced"] = sum(s.size for s in stats)
        out["top"] = [
            {"where": f"{s.traceback[0].filename}:{s.traceback[0].lineno}", "bytes": s.size, "count": s.count}
            for s in stats[:15]
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--after", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args()
    if args.trace:
        tracemalloc.start()

    def look_then_stop() -> None:
        # From when the daemon serves (its last thread is up), however long a loaded machine took.
        while not any(t.name == "socket-watch" for t in threading.enumerate()):
            time.sleep(0.05)
        time.sleep(args.after)
        args.out.write_text(json.dumps(inventory(args.trace)))
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=look_then_stop, name="bench-look", daemon=True).start()
    sys.argv = ["gpuwarden", "daemon"]
    from gpuwarden.cli.main import main as gpuwarden_main

    gpuwarden_main()


if __name__ == "__main__":
    main()
