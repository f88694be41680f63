"""Run every `bench/bench_*.py` module's `run()` and print one table.

Each module returns rows `{"benchmark", "value", "unit", "target", "ok"}`. `python -m bench store
daemon` runs only those modules. Results also go to `.bench/results.json` for docs/benchmarks.md.
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


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def main(argv: list[str]) -> int:
    rows: list[dict[str, Any]] = []
    failed = False
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

    headers = ["module", "benchmark", "value", "unit", "target", "ok"]
    table = [[_fmt(r.get(h, "")) if h != "ok" else _verdict(r.get("ok")) for h in headers] for r in rows]
    widths = [max(len(h), *(len(t[i]) for t in table)) if table else len(h) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for t in table:
        print("  ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)))
    out = Path(".bench")
    out.mkdir(exist_ok=True)
    meta = {
        "machine": platform.platform(),
        "python": platform.python_version(),
        "cpus": _cpus(),
        "time": time.time(),
    }
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))
    return 1 if failed else 0


def _verdict(ok: object) -> str:
    """yes / NO for rows with a target; "-" for rows that only inform (ok is None)."""
    return "-" if ok is None else ("yes" if ok else "NO")


def _cpus() -> int | None:
    import os

    return os.cpu_count()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
