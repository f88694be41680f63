"""Hostile input files: how fast each is refused and what it costs in memory, for a run spec and
for a command run's own config file (`command.config_file`) side by side.

The corpora are tests/hostile_corpus.py: specs (alias and merge bombs, deep nesting, 20 MB files,
non-UTF-8, Python tags, traversal, wrong types, files that are no spec) and config files (a link
to /dev/zero, a FIFO, 50 MB, JSON/TOML/YAML nested 100 000 deep, alias bombs, 400 000 values).
Measured: each file's refusal by the reader every command uses (median of 5, in process); the
peak memory a `gpuwarden doctor` process gains over each whole corpus (one child,
tests/hostile_driver.py); the peak memory a daemon gains over the config corpus submitted
through its API, with the slowest answer; and a large legitimate file read with the C loader
against PyYAML's pure-Python one.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.core.command.config_file import load_config
from gpuwarden.core.config.yamlsource import load_yaml_file
from gpuwarden.core.errors import UserError
from gpuwarden.core.safeload import C_LOADER

REPO = Path(__file__).resolve().parents[1]
MB = 1024 * 1024
NOT_REFUSED = {"cfg-python-tag.yaml"}  # the user's program may read its own tags: taken, never run


def _refusal_ms(read: Callable[[Path], object], path: Path) -> float:
    times = []
    for _ in range(5):
        start = time.perf_counter()
        with contextlib.suppress(UserError):
            read(path)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _driver_peak_mb(argvs: list[list[str]]) -> tuple[float, float]:
    """(peak after a benign spec, growth over every case), MB, of one `gpuwarden` process."""
    cases = [{"argv": ["doctor", str(REPO / "configs/examples/train-image-cpu.yaml")]}]
    cases += [{"argv": argv} for argv in argvs]
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


def _spec_naming(config: Path) -> str:
    return (
        "name: hostile-config\nkind: command\nresources: {gpus: 0}\n"
        f'command:\n  argv: [python3, -c, pass, --config, "{{config_file}}"]\n  config_file: {config}\n'
    )


def _refusal_rows(what: str, timings: dict[str, float], shown: tuple[str, ...]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [
        {"benchmark": f"{what} refusal: {name}", "value": timings[name], "unit": "ms", "target": "info"}
        for name in shown
    ]
    rows = [{**row, "ok": None} for row in rows]
    slowest = max(timings, key=lambda n: timings[n])
    rows.append(
        {
            "benchmark": f"{what} refusal: slowest of {len(timings)} files ({slowest})",
            "value": timings[slowest],
            "unit": "ms",
            "target": "< 1000 ms",
            "ok": timings[slowest] < 1000,
        }
    )
    return rows


def _memory_row(what: str, baseline: float, growth: float) -> dict[str, Any]:
    return {
        "benchmark": f"peak memory a doctor process gains over the whole {what} corpus",
        "value": round(growth, 1),
        "unit": f"MB (resident after a benign spec: {baseline:.0f} MB)",
        "target": "< 100 MB",
        "ok": growth < 100,
    }


def _spec_rows(root: Path) -> list[dict[str, Any]]:
    from tests.hostile_corpus import write_corpus

    files = write_corpus(root / "specs", root)
    timings = {name: _refusal_ms(load_yaml_file, path) for name, path in files.items()}
    shown = ("dev-zero", "a-fifo.yaml", "alias-bomb.yaml", "merge-bomb.yaml", "deep-flow.yaml", "huge.yaml")
    rows = _refusal_rows("spec", timings, shown)
    argvs = [["doctor", str(p)] for p in files.values() if p.name != "traversal-data.yaml"]
    rows.append(_memory_row("spec", *_driver_peak_mb(argvs)))
    return rows


def _config_rows(root: Path) -> list[dict[str, Any]]:
    from tests.hostile_corpus import write_config_corpus

    files = write_config_corpus(root / "configs", root)
    refused = {name: path for name, path in files.items() if name not in NOT_REFUSED}
    timings = {name: _refusal_ms(load_config, path) for name, path in refused.items()}
    shown = ("cfg-dev-zero.yaml", "cfg-fifo.toml", "cfg-50mb.toml", "cfg-deep.json", "cfg-deep-table.toml")
    rows = _refusal_rows("config file", timings, shown)
    specs = []
    for name, path in files.items():
        spec = root / f"spec-{name}.yaml"
        spec.write_text(_spec_naming(path))
        specs.append(spec)
    rows.append(_memory_row("config-file", *_driver_peak_mb([["doctor", str(s)] for s in specs])))
    rows += _daemon_rows(root, files)
    return rows


def _daemon_rows(root: Path, files: dict[str, Path]) -> list[dict[str, Any]]:
    """Every config file submitted through the API of one daemon: its peak memory's growth and the
    slowest answer (the FIFO and /dev/zero once grew it by gigabytes or held a thread for good)."""
    from bench.bench_daemon import DaemonNode

    node = DaemonNode(root / "daemon", "h100x2", 1.0)
    node.start()
    try:
        before = _peak_kb(node.pid())
        slowest = 0.0
        with node.http() as http:
            for path in files.values():
                spec = yaml.safe_load(_spec_naming(path))
                start = time.perf_counter()
                http.post("/v1/runs", json={"spec": spec})
                slowest = max(slowest, time.perf_counter() - start)
        growth = (_peak_kb(node.pid()) - before) / 1024
    finally:
        node.stop()
    return [
        {
            "benchmark": f"daemon: peak memory gained over {len(files)} config files submitted",
            "value": round(growth, 1),
            "unit": "MB",
            "target": "< 100 MB",
            "ok": growth < 100,
        },
        {
            "benchmark": "daemon: slowest answer to a submit naming a hostile config file",
            "value": round(slowest * 1000, 1),
            "unit": "ms",
            "target": "< 1000 ms",
            "ok": slowest < 1.0,
        },
    ]


def _peak_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


def _large_legitimate_row(root: Path) -> dict[str, Any]:
    """Just under the size limit and the value limit: long values, as a big spec would have."""
    large = root / "large.yaml"
    body = "".join(f"key_{i:05d}: {'v' * 200}\n" for i in range(4800))
    large.write_text("name: large\n" + body)
    ours = _refusal_ms(load_yaml_file, large)
    start = time.perf_counter()
    yaml.load(large.read_text(), Loader=yaml.SafeLoader)  # the pure-Python safe loader
    pure = (time.perf_counter() - start) * 1000
    size = large.stat().st_size / MB
    return {
        "benchmark": f"a {size:.2f} MB legitimate file: gpuwarden's reader "
        f"({'C' if C_LOADER else 'pure'} loader) vs PyYAML's pure-Python SafeLoader ({pure:.0f} ms)",
        "value": ours,
        "unit": "ms",
        "target": "info",
        "ok": None,
    }


def run() -> list[dict[str, Any]]:
    sys.path.insert(0, str(REPO))
    root = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    try:
        return [*_spec_rows(root), *_config_rows(root), _large_legitimate_row(root)]
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    for row in run():
        print(row)
