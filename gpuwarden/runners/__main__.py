"""Launch contract of gpuwarden's runners (the daemon uses it; it also works by hand):

    python -m gpuwarden.runners --spec RESOLVED.yaml --run-dir RUN_DIR [--attempt N] [--events PATH]

- RESOLVED.yaml is a complete RunSpec of kind `train` or `infer` with absolute paths (the daemon
  resolves relative ones at submit time, see `gpuwarden.core.config.resolve`).
- Events (protocol in `gpuwarden.core.events`) are appended to `RUN_DIR/attempts/<N>/events.jsonl`
  unless `--events` names another file. Without `--attempt`, N is one more than the highest
  numbered directory already in `RUN_DIR/attempts` (1 for a new run dir).
- Checkpoints live in `RUN_DIR/checkpoints/<step:08d>/`; a run resumes from the newest complete
  one. The final report goes to `RUN_DIR/report.json` and into the `finished` event.
- Exit status: EXIT_OK, EXIT_FAILED (a bug: traceback on stderr), EXIT_USER_ERROR (an `error`
  event with a one-line message, no traceback), EXIT_OOM (an `oom` event), EXIT_TERMINATED
  (SIGTERM: checkpoint written where the state allowed it), EXIT_GANG_ABORTED (another rank of a
  multi-process run failed first).
- Under `torch.distributed.run` (several ranks, `--attempt` required) rank N > 0 writes its events
  to `events.rank<N>.jsonl` next to rank 0's file (`gpuwarden.core.gang.files`), asks to die with
  torchrun, and records its own failures in torchrun's per-rank error file.
- SIGUSR1 writes every thread's stack to stderr (faulthandler), for diagnosing a hung run.

Runner bodies are imported lazily so that a spec error is reported without paying for torch:
train → `gpuwarden.runners.train.main:run`, infer → `gpuwarden.runners.infer.main:run`, both
`run(spec, run_dir, attempt, events) -> int`.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from gpuwarden.core.config.spec import RunSpec, load_spec
from gpuwarden.core.errors import UserError, one_line
from gpuwarden.core.events import (
    EXIT_FAILED,
    EXIT_GANG_ABORTED,
    EXIT_OK,
    EXIT_OOM,
    EXIT_TERMINATED,
    EXIT_USER_ERROR,
    Error,
    Oom,
)
from gpuwarden.core.gang.files import rank_events_path
from gpuwarden.runners.error_file import write_error_file
from gpuwarden.runners.events import EventWriter
from gpuwarden.runners.rank_env import RankEnv, die_with_parent, rank_env
from gpuwarden.runners.stop import STOP

RunnerBody = Callable[[RunSpec, Path, int, EventWriter], int]

ENTRY_POINTS = {
    "train": "gpuwarden.runners.train.main",
    "infer": "gpuwarden.runners.infer.main",
}


def next_attempt(run_dir: Path) -> int:
    """One more than the highest numbered `attempts/<n>` directory (1 when there is none)."""
    attempts = run_dir / "attempts"
    numbers = [int(p.name) for p in attempts.iterdir() if p.name.isdigit()] if attempts.is_dir() else []
    return max(numbers, default=0) + 1


def load_body(kind: str) -> RunnerBody:
    """The `run` function of the runner body for `kind` (imported here, not at start-up)."""
    module_name = ENTRY_POINTS.get(kind)
    if module_name is None:
        raise UserError(
            f"kind '{kind}' is not run by gpuwarden's runners — the daemon runs commands directly",
            code="unsupported",
        )
    module = importlib.import_module(module_name)
    body: RunnerBody = module.run
    return body


def report_failure(exc: BaseException, events: EventWriter) -> int:
    """Turn an exception that escaped a runner body into an event and an exit status.

    Runner bodies handle out-of-memory themselves where they can checkpoint; this catches the
    rest (e.g. an OOM while loading the model) so the daemon still gets a classified `oom` event.
    """
    if isinstance(exc, UserError):
        message = one_line(exc.message)
        events.emit(Error(code=exc.code, message=message))
        print(f"gpuwarden: {message}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
    from gpuwarden.core.oom.classify import classify_exception

    verdict = classify_exception(exc)
    if verdict.is_oom:
        events.emit(
            Oom(verdict=verdict.verdict, message=verdict.message, fields=verdict.fields, phase="load")
        )
        print(f"gpuwarden: out of memory ({verdict.verdict}): {verdict.message}", file=sys.stderr, flush=True)
        return EXIT_OOM
    if verdict.verdict == "shape_bug":
        # An allocation larger than the device: a bug in shapes, not a setting to retune.
        message = one_line(f"shape_bug: {verdict.reason}")
        events.emit(Error(code="shape_bug", message=message))
        print(f"gpuwarden: {message}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    events.emit(Error(code="bug", message=one_line(f"{type(exc).__name__}: {exc}")[:2000]))
    traceback.print_exception(exc, file=sys.stderr)
    return EXIT_FAILED


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpuwarden.runners", description="Run one attempt of a gpuwarden train/infer run."
    )
    parser.add_argument("--spec", type=Path, required=True, help="resolved run spec (YAML)")
    parser.add_argument("--run-dir", type=Path, required=True, help="the run's directory")
    parser.add_argument("--attempt", type=int, default=None, help="attempt number (default: next free)")
    parser.add_argument("--events", type=Path, default=None, help="events file (default: in the attempt dir)")
    return parser


def run_body(spec_path: Path, run_dir: Path, attempt: int, events: EventWriter) -> int:
    """Load the spec and run its body; every failure becomes an event and an exit status."""
    try:
        spec = load_spec(spec_path)
        body = load_body(spec.kind)
        return body(spec, run_dir, attempt, events)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # every failure must become an event
        if isinstance(exc, SystemExit):
            raise
        return report_failure(exc, events)


def gang_of(args: argparse.Namespace) -> RankEnv | None:
    """This process's rank when torchrun started several; UserError for what cannot work."""
    ranks = rank_env()
    if ranks is None or ranks.world_size == 1:
        return None
    if args.attempt is None:
        raise UserError(
            "a multi-process run needs --attempt N: every rank must write into the same attempt",
            code="unsupported",
        )
    return ranks


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the body for the spec's kind, and map failures to exit codes."""
    args = build_parser().parse_args(argv)
    try:
        ranks = gang_of(args)
    except UserError as exc:
        print(f"gpuwarden: {exc.message}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
    if ranks is not None:
        die_with_parent()
    run_dir: Path = args.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    attempt: int = args.attempt if args.attempt is not None else next_attempt(run_dir)
    events_path: Path = args.events or run_dir / "attempts" / str(attempt) / "events.jsonl"
    rank = ranks.rank if ranks is not None else None
    STOP.install()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    with EventWriter(rank_events_path(events_path, rank or 0), rank=rank) as events:
        status = run_body(args.spec, run_dir, attempt, events)
        if rank is not None and status not in (EXIT_OK, EXIT_TERMINATED, EXIT_GANG_ABORTED):
            write_error_file(events.last_failure, status, rank)
    if rank is not None:
        exit_now(status)
    return status


def exit_now(status: int) -> None:
    """Leave without the interpreter's teardown (seconds with torch loaded): the other ranks of
    the gang and torchrun see this rank gone as soon as its events and checkpoints are on disk."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
