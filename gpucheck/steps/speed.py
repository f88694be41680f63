"""Runner and tuning speed on the GPU: the benchmarks of `bench/`, measured there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpucheck.result import StepResult


def _sweep() -> list[dict[str, Any]]:
    from bench.bench_tune import sweep

    results = sweep()["results"]
    ok = [r for r in results if r["ok"]]
    best = max(ok, key=lambda r: r["samples_per_s"]) if ok else None
    rows = [
        {
            "benchmark": f"sweep: micro-batch {r['candidate']['batch_size']}, {r['candidate']['precision']}"
            f"{', compile' if r['candidate']['compile'] else ''}",
            "value": r["samples_per_s"],
            "unit": "samples/s" if r["ok"] else (r.get("error") or "out of memory"),
            "target": "",
            "ok": None,
        }
        for r in results
    ]
    if best is None:
        rows.append(
            {"benchmark": "sweep: a configuration that ran", "value": None, "target": "one", "ok": False}
        )
    return rows


def _runs(name: str) -> Callable[[], list[dict[str, Any]]]:
    if name == "speed-train":
        from bench.bench_train import run as train

        return train
    if name == "speed-generate":
        from bench.bench_infer import run as generate

        return generate
    if name == "tune-sweep":
        return _sweep
    from bench.bench_tune import run as tune

    return tune


def run(name: str) -> StepResult:
    rows = _runs(name)()
    targets = [r for r in rows if r.get("ok") is not None]
    summary = (
        f"{sum(1 for r in targets if r['ok'])} of {len(targets)} targets met"
        if targets
        else f"{len(rows)} rows"
    )
    return StepResult.from_rows(name, rows, summary)
