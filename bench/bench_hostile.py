"""Hostile input files: how fast each is refused and what it costs in memory.

The corpus is tests/hostile_corpus.py (alias and merge bombs, deep nesting, 20 MB files,
non-UTF-8, Python tags, traversal, wrong types). Measured: each file's refusal by the reader every
command uses (median of 5, in process), the peak memory a `gpuwarden doctor` process gains over
the whole corpus (one child, tests/hostile_driver.py), and a large legitimate file read with the
C loader against PyYAML's pure-Python one.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.core.config.yamlsource import load_yaml_file
from gpuwarden.core.errors import UserError
from gpuwarden.core.safeload import C_LOADER

REPO = Path(__file__).resolve().parents[1]
MB = 1024 * 1024


def _refusal_ms(path: Path) -> float:
    times = []
    for _ in range(5):
        start = time.perf_counter()
        with contextlib.suppress(UserError):
            load_yaml_file(path)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _doctor_peak_mb(files: dict[str, Path]) -> tuple[float, float]:
    """(peak after a benign spec, growth over the whole corpus), MB."""
    cases = [{"argv": ["doctor", str(REPO / "configs/examples/train-image-cpu.yaml")]}]
    cases += [{"argv": ["doctor", str(p)]} for p in files.values() if p.name != "traversal-data.yaml"]
    done = subprocess.run(
        [sys.executable, "-m", "tests.hostile_driver"],
        input=json.dumps({"cases": cases}),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        check=True,
    )
    report = json.loads(done.stdout)
    return report["baseline_kb"] / 1024, (report["peak_kb"] - report["baseline_kb"]) / 1024


def _large_legitimate(folder: Path) -> Path:
    """Just under the size limit and the value limit: long values, as a big spec would have."""
    path = folder / "large.yaml"
    body = "".join(f"key_{i:05d}: {'v' * 200}\n" for i in range(4800))
    path.write_text("name: large\n" + body)
    return path


def run() -> list[dict[str, Any]]:
    sys.path.insert(0, str(REPO))
    from tests.hostile_corpus import write_corpus

    root = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    rows: list[dict[str, Any]] = []
    try:
        files = write_corpus(root / "corpus", root)
        timings = {name: _refusal_ms(path) for name, path in files.items() if name != "a-fifo.yaml"}
        slowest = max(timings, key=lambda n: timings[n])
        for name in ("alias-bomb.yaml", "merge-bomb.yaml", "deep-flow.yaml", "huge.yaml", "many-values.yaml"):
            row = {"benchmark": f"refusal: {name}", "value": timings[name], "unit": "ms"}
            rows.append({**row, "target": "info", "ok": None})
        rows.append(
            {
                "benchmark": f"refusal: slowest of {len(timings)} corpus files ({slowest})",
                "value": timings[slowest],
                "unit": "ms",
                "target": "< 1000 ms",
                "ok": timings[slowest] < 1000,
            }
        )
        baseline, growth = _doctor_peak_mb(files)
        rows.append(
            {
                "benchmark": "peak memory a doctor process gains over the whole corpus",
                "value": round(growth, 1),
                "unit": f"MB (peak after a benign spec: {baseline:.0f} MB)",
                "target": "< 100 MB",
                "ok": growth < 100,
            }
        )
        large = _large_legitimate(root)
        ours = _refusal_ms(large)
        start = time.perf_counter()
        yaml.load(large.read_text(), Loader=yaml.SafeLoader)  # the pure-Python safe loader
        pure = (time.perf_counter() - start) * 1000
        size = large.stat().st_size / MB
        rows.append(
            {
                "benchmark": f"a {size:.2f} MB legitimate file: gpuwarden's reader "
                f"({'C' if C_LOADER else 'pure'} loader) vs PyYAML's pure-Python SafeLoader ({pure:.0f} ms)",
                "value": ours,
                "unit": "ms",
                "target": "info",
                "ok": None,
            }
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
