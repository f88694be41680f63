"""`python -m gpucheck [--steps a,b] [--dry] [--list]`: run the GPU check and write the report.

Exit status 0 when no step failed, errored or overran (skipped steps are fine: that is the dry
mode on a machine without a GPU); 1 otherwise; 2 for a usage mistake.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpucheck import report
from gpucheck.machine import describe
from gpucheck.result import StepResult
from gpucheck.runner import run_all
from gpucheck.step import DRY_ENV
from gpucheck.steps import STEPS, by_name

BAD = ("failed", "error", "timeout")


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gpucheck", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", help="comma-separated step names (default: all; see --list)")
    parser.add_argument("--dry", action="store_true", help="skip every step on purpose (plumbing only)")
    parser.add_argument("--list", action="store_true", help="list the steps and exit")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for gpu-report.md/.json")
    parser.add_argument("--logs", type=Path, default=Path(".gpu-check"), help="folder for step logs")
    return parser.parse_args(argv)


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

    def done(r: StepResult) -> None:
        print(f"{r.name}: {r.status} — {r.summary} ({r.seconds} s)", flush=True)

    steps = [(n, by_name(n).argv(), by_name(n).timeout_s) for n in names]
    results = run_all(steps, args.logs, on_done=done, env=env)
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = args.out / "gpu-report.json", args.out / "gpu-report.md"
    merged = report.merge(report.load(json_path), describe(), results, [s.name for s in STEPS])
    report.write(merged, json_path, md_path)
    print(f"wrote {md_path} and {json_path}")
    return 1 if any(r.status in BAD for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
