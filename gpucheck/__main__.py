"""`python -m gpucheck [--budget S] [--steps a,b] [--again] [--dry] [--list]`: run the GPU check
inside a time budget and write the report after every step.

Without --steps it runs the steps that have not passed for the code as it is now, in order of
value, as many as fit the budget (counted from `$GPUCHECK_STARTED`, the epoch second `make
gpu-check` started, so installing the wheels counts too); the next window goes on with the rest.
Exit status 0 when no step failed, errored or overran (skipped steps are fine: that is the dry
mode on a machine without a GPU); 1 otherwise; 2 for a usage mistake.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from gpucheck import report
from gpucheck.machine import describe, nvml_missing
from gpucheck.result import StepResult
from gpucheck.runner import run_step
from gpucheck.step import DRY_ENV
from gpucheck.steps import STEPS, by_name
from gpucheck.window import WindowStep, code_fingerprint, run_in_window, still_to_run

BAD = ("failed", "error", "timeout")
REPO = Path(__file__).resolve().parents[1]
# One lent GPU window is about ten minutes of commands, its start included.
DEFAULT_BUDGET_S = 540.0
STARTED_ENV = "GPUCHECK_STARTED"
QUICK_S = 1.0


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gpucheck", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", help="comma-separated step names (default: all; see --list)")
    parser.add_argument("--dry", action="store_true", help="skip every step on purpose (plumbing only)")
    parser.add_argument("--list", action="store_true", help="list the steps and exit")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for gpu-report.md/.json")
    parser.add_argument("--logs", type=Path, default=Path(".gpu-check"), help="folder for step logs")
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"seconds the whole check may take (default {DEFAULT_BUDGET_S:.0f}: one GPU window)",
    )
    parser.add_argument("--again", action="store_true", help="run steps that passed for this code too")
    args = parser.parse_args(argv)
    if args.budget <= 0:
        parser.error(f"--budget {args.budget:g}: give the seconds the check may take, e.g. 540")
    return args


def _started() -> float:
    """When the check started: `make gpu-check` says (before the wheels), else now."""
    given = os.environ.get(STARTED_ENV, "")
    return float(given) if given.isdigit() else time.time()


def main(argv: list[str]) -> int:
    args = _parse(argv)
    if args.list:
        for s in STEPS:
            print(f"{s.name:<18} {s.title}")
        return 0
    names = [n.strip() for n in args.steps.split(",") if n.strip()] if args.steps else [s.name for s in STEPS]
    unknown = [n for n in names if n not in {s.name for s in STEPS}]
    if unknown:
        print(f"gpucheck: unknown step {unknown[0]!r} — see --list", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if args.dry:
        env[DRY_ENV] = "1"

    args.out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = args.out / "gpu-report.json", args.out / "gpu-report.md"
    old = report.load(json_path)
    code = code_fingerprint(REPO)
    if not args.steps and not args.again:
        passed = [n for n in names if n not in still_to_run(names, old, code)]
        names = [n for n in names if n not in passed]
        if passed:
            print(f"passed for this code already (--again runs them): {', '.join(passed)}", flush=True)
    machine = describe()
    saved = old

    def done(r: StepResult) -> None:
        nonlocal saved
        print(f"{r.name}: {r.status} — {r.summary} ({r.seconds} s)", flush=True)
        saved = report.merge(saved, machine, [r], [s.name for s in STEPS])
        report.write(saved, json_path, md_path)  # after every step: a window may end at any time

    # Where every step will say at once that it has nothing to measure, none needs its time.
    quick = args.dry or nvml_missing() is not None
    steps = [
        WindowStep(n, by_name(n).argv(), by_name(n).timeout_s, QUICK_S if quick else by_name(n).expect_s)
        for n in names
    ]
    window = run_in_window(
        steps,
        _started() + args.budget,
        lambda name, argv, timeout: run_step(name, argv, timeout, args.logs, env),
        report=old,
        code=code,
        on_done=done,
    )
    if saved is not old:
        print(f"wrote {md_path} and {json_path}")
    if window.left:
        print(
            f"left for the next window (they do not fit in what is left of {args.budget:.0f} s): "
            f"{', '.join(window.left)}"
        )
    return 1 if any(r.status in BAD for r in window.results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
