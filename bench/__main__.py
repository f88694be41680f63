"""Run every `bench/bench_*.py` module's `run()` and print one table.

Each module returns rows `{"benchmark", "value", "unit", "target", "ok"}` built by
`bench.figures.figure_row`: the value is the median of at least three repetitions, with their
range; `ok` is None for rows without a target. `python -m bench store daemon` runs only those
modules. Results also go to `.bench/results.json` (with the machine's load before and after) for
docs/benchmarks.md.
"""

from __future__ import annotations

import importlib
import json
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench.figures import table

HERE = Path(__file__).resolve().parent


def _modules(selected: list[str]) -> list[str]:
    names = sorted(p.stem for p in HERE.glob("bench_*.py"))
    if not selected:
        return names
    unknown = [s for s in selected if f"bench_{s}" not in names and s not in names]
    if unknown:
        available = ", ".join(n.removeprefix("bench_") for n in names)
        raise SystemExit(f"bench: unknown benchmark {unknown[0]!r} — available: {available}")
    return [n for n in names if n in selected or n.removeprefix("bench_") in selected]


def main(argv: list[str]) -> int:
    rows: list[dict[str, Any]] = []
    failed = False
    load_before = _load()
    for name in _modules(argv):
        print(f"running {name} …", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            module = importlib.import_module(f"bench.{name}")
            for row in module.run():
                rows.append({"module": name.removeprefix("bench_"), **row})
        except Exception:
            failed = True
            traceback.print_exc()
            rows.append(
                {"module": name, "benchmark": "(crashed)", "value": "", "unit": "", "target": "", "ok": False}
            )
        print(f"  {name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)

    print(table(rows))
    out = Path(".bench")
    out.mkdir(exist_ok=True)
    meta = {
        "machine": platform.platform(),
        "python": platform.python_version(),
        "cpus": _cpus(),
        "time": time.time(),
        # The machine may be shared: its load average around the run says how busy it was.
        "load_before": load_before,
        "load_after": _load(),
    }
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))
    return 1 if failed else 0


def _load() -> list[float] | None:
    import os

    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _cpus() -> int | None:
    import os

    return os.cpu_count()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
