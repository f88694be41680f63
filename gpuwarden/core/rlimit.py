"""Exec wrapper: `python -I rlimit.py BYTES -- PROGRAM ARGS…` sets RLIMIT_AS, then
becomes PROGRAM (same pid), so the limit applies to the run and nothing else.

A wrapper rather than `preexec_fn`: the daemon is threaded, and code between fork and exec in a
threaded process can deadlock. Runs and the probes of tuning and recovery all start through it.
"""

from __future__ import annotations

import os
import resource
import sys


def limited_argv(argv: list[str], limit: int | None) -> list[str]:
    """`argv` wrapped so that it runs under an address-space limit of `limit` bytes (if any)."""
    if limit is None:
        return argv
    # Isolated and started as this file (it needs only the standard library): the run's
    # PYTHONPATH or a `resource.py` of the user's cannot replace the module that sets the limit.
    return [sys.executable, "-I", os.path.abspath(__file__), str(int(limit)), "--", *argv]


def main(args: list[str]) -> None:
    """Apply the limit and exec; exit 127 with one line when the program cannot be started."""
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: python -I rlimit.py BYTES -- PROGRAM [ARGS…]\n")
        sys.exit(2)
    limit = int(args[0])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        os.execvp(args[2], args[2:])
    except OSError as exc:
        sys.stderr.write(f"gpuwarden: cannot start {args[2]!r}: {exc.strerror}\n")
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
