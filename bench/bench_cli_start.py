"""Everyday commands' wall time, start to exit: `gpuwarden ps`, `show RUN`, `status` against an
idle daemon (2 fake GPUs, one finished run), each a fresh `python -m gpuwarden` as a person
types it. The daemon answers in milliseconds: what is measured is mostly Python starting and
importing what the command needs.

- warm: the files already in the OS page cache (a command typed again);
- cold: every file the command reads (its modules' sources, their bytecode, extension modules)
  evicted from the page cache first (posix_fadvise DONTNEED, those files only), as the first
  command after a reboot or a long pause reads them from disk.

Target: ≤ 0.3 s warm on an idle machine. `python -X importtime -m gpuwarden ps` shows what is
imported.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_daemon import DaemonNode
from bench.figures import figure_row, main_for

TARGET_S = 0.3
RUNS = 5  # each figure: the median of this many starts
COMMANDS = (("ps",), ("show", "{run}"), ("status",))

_FILES_READ = (
    "import json, sys\n"
    "from gpuwarden.cli.main import main\n"
    "main(sys.argv[1:])\n"
    "files = [getattr(m, '__file__', None) for m in list(sys.modules.values())]\n"
    "sys.stderr.write(json.dumps([f for f in files if f]))\n"
)


def _files_read(node: DaemonNode, args: list[str]) -> list[str]:
    """The files a command's modules come from, with their bytecode."""
    done = subprocess.run(
        [sys.executable, "-c", _FILES_READ, *args],
        env=_user_env(node),
        capture_output=True,
        text=True,
        timeout=60,
    )
    files: list[str] = []
    for source in json.loads(done.stderr.splitlines()[-1]):
        path = Path(source)
        files.append(source)
        if path.suffix == ".py":
            files += [str(p) for p in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc")]
    return files


def _evict(files: list[str]) -> None:
    for name in files:
        try:
            fd = os.open(name, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _user_env(node: DaemonNode) -> dict[str, str]:
    """A user's shell beside the daemon: its XDG folders, none of the daemon's GPUWARDEN_ settings."""
    return {k: v for k, v in node.env.items() if not k.startswith("GPUWARDEN_")}


def _start(node: DaemonNode, args: list[str], argv: list[str] | None = None) -> tuple[float, float]:
    """One command's wall time and CPU time (user + system: what the machine's load inflates
    least), in seconds."""
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        argv or [sys.executable, "-m", "gpuwarden", *args],
        env=_user_env(node),
        capture_output=True,
        timeout=60,
    )
    took = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"gpuwarden {' '.join(args)}: {done.stderr.decode()[-500:]}")
    return took, (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)


def _rows(
    name: str, warm: list[tuple[float, float]], cold: list[tuple[float, float]]
) -> list[dict[str, Any]]:
    return [
        figure_row(
            f"{name}, warm", [w for w, _ in warm], "s", target=f"≤ {TARGET_S}", check=lambda v: v <= TARGET_S
        ),
        figure_row(f"{name}, warm, CPU time", [c for _, c in warm], "s"),
        figure_row(f"{name}, cold (its files evicted)", [w for w, _ in cold], "s"),
    ]


def run() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gwcli", dir="/tmp") as tmp:
        node = DaemonNode(Path(tmp), "h100x2", 1.0)
        node.start()
        try:
            submitted = node.cli("run", "--json", "--", "true")
            run_id = json.loads(submitted.stdout)["id"]
            # The floor: Python starting and exiting, nothing imported.
            bare = [_start(node, [], [sys.executable, "-c", "pass"]) for _ in range(RUNS)]
            rows.append(figure_row("`python -c pass` (Python's own start)", [w for w, _ in bare], "s"))
            for words in COMMANDS:
                args = [w.format(run=run_id) for w in words]
                files = _files_read(node, args)
                warm = [_start(node, args) for _ in range(RUNS)]
                cold = []
                for _ in range(RUNS):
                    _evict(files)
                    cold.append(_start(node, args))
                rows += _rows(f"`gpuwarden {words[0]}`", warm, cold)
        finally:
            node.stop()
    return rows


if __name__ == "__main__":
    sys.exit(main_for(run))
