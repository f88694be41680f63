"""Every file of the hostile corpus (tests/hostile_corpus.py) through every entry point that reads
one: `run`, `doctor` and `tune` (plain and --json), the daemon's config file, and `POST /v1/runs`.

Each is refused with one line and no traceback, in bounded time and memory (the child's peak RSS
over all files stays within 100 MB of its peak after a benign file), nothing is executed and
nothing is written outside the daemon's own state. Figures: `python -m bench hostile`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.daemon.conftest import REPO, DaemonHandle
from tests.hostile_corpus import MARKER_NAME, SECRET, write_corpus

BENIGN = REPO / "configs" / "examples" / "train-image-cpu.yaml"
MEMORY_BOUND_KB = 100 * 1024
# Generous: each refusal takes milliseconds; this only catches a hang or an expansion.
SECONDS_BOUND = 20.0
# doctor diagnoses what it can read: a spec whose paths point at system files is reported on,
# not refused (run and tune refuse it: the model and data are not what they must be).
DIAGNOSED_BY_DOCTOR = {"traversal-data.yaml"}


@pytest.fixture
def sandbox(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    root = tmp_path / "sandbox"
    files = write_corpus(root / "corpus", root)
    return root, files


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _drive(gw: DaemonHandle, cases: list[dict[str, Any]]) -> dict[str, Any]:
    """All cases in one child process (tests/hostile_driver.py), after a benign warm-up."""
    warmup = {"argv": ["doctor", str(BENIGN)]}
    done = subprocess.run(
        [sys.executable, "-m", "tests.hostile_driver"],
        input=json.dumps({"cases": [warmup, *cases]}),
        capture_output=True,
        text=True,
        env=gw.env,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["results"][0]["code"] == 0, report["results"][0]
    return report


def _not_refused_properly(result: dict[str, Any], max_lines: int = 1) -> str | None:
    """Why `result` is not a one-line refusal in bounded time (None when it is one)."""
    lines = result["stderr"].splitlines()
    if result["code"] != 2:
        return f"exit status {result['code']}: {result['stderr'][-300:]}"
    if not 1 <= len(lines) <= max_lines or any(
        not line.startswith("gpuwarden: ") or len(line) > 1000 for line in lines
    ):
        return f"not {max_lines} line(s): {lines[:4]}"
    if result["stdout"]:
        return f"printed {result['stdout'][:200]!r}"
    if result["seconds"] > SECONDS_BOUND:
        return f"took {result['seconds']:.1f} s"
    return None


def test_every_file_through_every_command(gw: DaemonHandle, sandbox: tuple[Path, dict[str, Path]]) -> None:
    root, files = sandbox
    before = _tree(root)
    commands = [["run"], ["run", "--json"], ["doctor"], ["doctor", "--json"], ["tune"], ["tune", "--json"]]
    cases: list[dict[str, Any]] = [
        {"argv": [*cmd[:1], str(path), *cmd[1:]]} for cmd in commands for path in files.values()
    ]
    # The daemon's config file: `gpuwarden daemon` must refuse it before starting anything.
    cases += [{"argv": ["daemon"], "env": {"GPUWARDEN_CONFIG": str(path)}} for path in files.values()]
    report = _drive(gw, cases)

    failures = []
    for result in report["results"][1:]:
        name = Path(result["argv"][1]).name if result["argv"][0] != "daemon" else "config"
        if result["argv"][0] == "doctor" and name in DIAGNOSED_BY_DOCTOR:
            assert result["code"] == 0 and "Traceback" not in result["stderr"], result
            continue
        why = _not_refused_properly(result)
        if why is None and SECRET in result["stderr"] + result["stdout"]:
            why = f"shows what the file holds: {result['stderr']}"
        if why is not None:
            failures.append(f"{' '.join(result['argv'])} {result.get('env', '')}: {why}")
    assert not failures, "\n".join(failures)
    assert report["peak_kb"] - report["baseline_kb"] < MEMORY_BOUND_KB, (
        report["peak_kb"] - report["baseline_kb"]
    )
    assert not (root / MARKER_NAME).exists() and not Path("/tmp/escaped").exists()
    assert _tree(root) == before
    with gw.client() as client:
        assert client.runs() == []


def _daemon_peak_kb(gw: DaemonHandle) -> int:
    assert gw.proc is not None
    status = Path(f"/proc/{gw.proc.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


def test_every_file_through_the_api(gw: DaemonHandle, sandbox: tuple[Path, dict[str, Path]]) -> None:
    root, files = sandbox
    texts = {}
    for name, path in files.items():
        if path.is_file() and path.stat().st_size <= 1_000_000:
            try:
                texts[name] = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
    assert {"alias-bomb.yaml", "deep-flow.yaml", "python-apply.yaml", "many-values.yaml"} <= set(texts)
    transport = httpx.HTTPTransport(uds=str(gw.socket))
    baseline = _daemon_peak_kb(gw)
    deep_json: Any = "leaf"
    for _ in range(200):
        deep_json = {"train": deep_json}
    bodies: list[dict[str, Any]] = [{"spec_yaml": text, "label": name} for name, text in texts.items()]
    bodies.append({"spec": {"name": "deep", "kind": "train", "train": deep_json}, "label": "deep-json"})
    with httpx.Client(transport=transport, base_url="http://gpuwarden", timeout=SECONDS_BOUND) as http:
        for body in bodies:
            response = http.post("/v1/runs", json=body)
            assert 400 <= response.status_code < 500, (
                body["label"],
                response.status_code,
                response.text[:300],
            )
            message = response.json()["error"]["message"]
            assert "\n" not in message and len(message) < 1000, (body["label"], message[:300])
            assert SECRET not in message, (body["label"], message)
            assert "Traceback" not in message and "RecursionError" not in message, body["label"]
        assert http.get("/v1/health").status_code == 200
    assert _daemon_peak_kb(gw) - baseline < MEMORY_BOUND_KB
    assert psutil.Process(gw.proc.pid if gw.proc else 0).is_running()
    assert not (root / MARKER_NAME).exists()
    with gw.client() as client:
        assert client.runs() == []
