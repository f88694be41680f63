"""`gpuwarden doctor|report|compare` as a user runs them: subprocesses, JSON parsed, bad input
reported in one line with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import preloaded
from tests.doctor.test_run_checks import record_fp32_captcha_run, record_restoration_with_idle_gaps
from tests.report.builders import T0, Recorder
from tests.report.test_report import record_captcha_run

REPO = Path(__file__).resolve().parents[2]
NAIVE = REPO / "configs" / "examples" / "naive-image-train.yaml"


def gw(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    # no daemon for these tests: a socket path where none listens
    base["GPUWARDEN_SOCKET"] = "/nonexistent/gpuwarden-test.sock"
    return preloaded.run(
        [sys.executable, "-m", "gpuwarden", *args],
        env={**base, **(env or {})},
        cwd=cwd,
        timeout=60,
    )


def ok_json(*args: str, env: dict[str, str] | None = None) -> Any:
    proc = gw(*args, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("db") / "g.db"
    rec = Recorder(path)
    record_fp32_captcha_run(rec)
    record_restoration_with_idle_gaps(rec)
    record_captcha_run(rec, "before", T0 + 7200, 300.0, 256)
    record_captcha_run(rec, "after", T0 + 14400, 450.0, 512)
    return path


def test_doctor_fix_writes_a_spec_doctor_finds_clean(tmp_path: Path) -> None:
    out = tmp_path / "fixed.yaml"
    body = ok_json("doctor", str(NAIVE), "--gpu-memory", "24GiB", "--fix", str(out), "--json")
    assert body["target"] == str(NAIVE) and body["device"]["memory_total"] == 24 << 30
    ids = {f["id"] for f in body["findings"]}
    assert {
        "precision-fp32",
        "compile-off",
        "sync-every-step",
        "optimizer-unfused",
        "micro-batch-small",
    } <= ids
    assert body["fixed"]["remaining_fixable"] == []
    text = out.read_text()
    assert text.startswith("# Written by `gpuwarden doctor --fix`") and "batch_size: 64" in text
    again = ok_json("doctor", str(out), "--gpu-memory", "24GiB", "--json")
    assert [f["id"] for f in again["findings"] if f["fixable"]] == []
    # still a valid spec for the runner
    from gpuwarden.core.config.spec import load_spec

    assert load_spec(out).train is not None
    # Fixed again: nothing left to change, and it says so rather than "0 change(s) for nothing".
    twice = gw("doctor", str(out), "--gpu-memory", "24GiB", "--fix", str(tmp_path / "twice.yaml"))
    assert twice.returncode == 0, twice.stderr
    assert "the spec as it was, nothing needed fixing" in twice.stderr and "0 change(s)" not in twice.stderr


def test_doctor_human_output_is_sorted_and_shows_evidence() -> None:
    proc = gw("doctor", str(NAIVE), "--gpu-memory", "16GiB")
    assert proc.returncode == 0
    assert "WARNING  precision-fp32" in proc.stdout and f"train.amp = false at {NAIVE}:19" in proc.stdout
    assert "fix (--fix): train.precision: auto; train.amp: removed" in proc.stdout


def test_doctor_detects_a_fake_gpu() -> None:
    body = ok_json("doctor", str(NAIVE), "--json", env={"GPUWARDEN_FAKE_NVML": "h100"})
    assert body["device"]["device"] == "gpu" and "H100" in body["device"]["source"]
    batch = next(f for f in body["findings"] if f["id"] == "micro-batch-small")
    assert batch["evidence"]["tier"] == "80 GB" and batch["fix"] == {"train.batch_size": 192}


def test_doctor_on_recorded_runs(db: Path) -> None:
    body = ok_json("doctor", "captcha", "--db", str(db), "--json")
    under = next(f for f in body["findings"] if f["id"] == "gpu-underused")
    assert under["evidence"]["power_pct"] == 52.2 and under["severity"] == "warning"
    body = ok_json("doctor", "restore", "--db", str(db), "--json")
    gaps = next(f for f in body["findings"] if f["id"] == "data-loading-bound")
    assert gaps["evidence"]["gap_share_pct"] == 80.0 and gaps["fix"] == {"train.num_workers": "auto"}


def test_doctor_fix_from_a_run_writes_its_spec(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "captcha-fixed.yaml"
    body = ok_json("doctor", "captcha", "--db", str(db), "--fix", str(out), "--json")
    assert body["fixed"]["changes"]["train.precision"] == "auto"
    assert body["fixed"]["changes"]["train.batch_size"] == 1024
    from gpuwarden.core.config.spec import load_spec

    spec = load_spec(out)
    assert spec.train is not None and spec.train.batch_size == 1024 and spec.train.amp is None


def test_report_json_and_markdown_and_plots(db: Path, tmp_path: Path) -> None:
    r = ok_json("report", "before", "--db", str(db), "--json")
    assert r["throughput"]["samples_per_s"] == pytest.approx(256.0)
    assert r["energy"]["joules"] == pytest.approx(36000.0)
    proc = gw("report", "before", "--db", str(db), "--md", "--plots", str(tmp_path / "plots"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# Run report: before") and "| samples/s |" in proc.stdout
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == ["loss.png", "memory.png", "power_util.png", "throughput.png"]
    assert all((tmp_path / "plots" / p).read_bytes().startswith(b"\x89PNG") for p in pngs)


def test_report_plots_of_a_run_without_progress_say_so_and_make_no_folder(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "g.db")
    spec = {"version": 1, "name": "quiet", "kind": "command", "command": {"argv": ["true"]}}
    rec.run("quiet", spec, [(T0, T0 + 30, [], 0)], {1: []}, kind="command")
    proc = gw("report", "quiet", "--db", str(tmp_path / "g.db"), "--plots", str(tmp_path / "plots"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "no plots: the run reported no progress\n"
    assert not (tmp_path / "plots").exists() and "plot:" not in proc.stdout


def test_compare_json(db: Path) -> None:
    c = ok_json("compare", "before", "after", "--db", str(db), "--json")
    rows = {r["metric"]: r for r in c["rows"]}
    assert rows["samples_per_s"]["ratio"] == pytest.approx(2.0)
    assert rows["energy_per_sample_j"]["ratio"] == pytest.approx(0.75)
    proc = gw("compare", "before", "after", "--db", str(db))
    assert proc.returncode == 0 and "2.00×" in proc.stdout
    # Rows named as a person reads them, each unit once; the JSON keeps the keys.
    labels = [line.split("  ")[0] for line in proc.stdout.splitlines()[1:]]
    assert labels[:2] == ["samples/s (loop)", "samples/s over wall time"]
    assert "energy per sample (J)" in labels and "wall time (s)" in labels
    assert not any("_" in label for label in labels), labels


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["doctor", "missing.yaml"], "missing.yaml: no such file"),
        (
            ["doctor", "{bad}"],
            "the daemon is not running — start it with `gpuwarden up`, or pass --db PATH",
        ),
        (["report", "r1"], "the daemon is not running"),
        (["doctor", "naive.yaml", "--gpu-memory", "24"], "--gpu-memory '24'"),
        (["report", "x", "--json", "--md"], "choose one output format"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    proc = gw(*[str(NAIVE) if a == "naive.yaml" else a for a in args], cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_invalid_spec_and_unknown_run_are_one_line(db: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: b\nkind: train\ntrain:\n  task: image\n  batch_size: -1\n")
    proc = gw("doctor", str(bad))
    assert proc.returncode == 2 and f"{bad}:5: train.batch_size" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    for args in (
        ["doctor", "nope", "--db", str(db)],
        ["report", "nope", "--db", str(db)],
        ["compare", "before", "nope", "--db", str(db)],
    ):
        proc = gw(*args)
        assert (
            proc.returncode == 2 and "no run matches 'nope'" in proc.stderr and "Traceback" not in proc.stderr
        )
        # `gpuwarden ps` lists the daemon's runs, not this file's: the line names what the file holds
        assert f"in {db} — it holds " in proc.stderr and "after" in proc.stderr, proc.stderr
        assert "gpuwarden ps" not in proc.stderr and proc.stderr.count("\n") == 1
    proc = gw("report", "x", "--db", str(tmp_path / "none.db"))
    assert proc.returncode == 2 and "no gpuwarden database there" in proc.stderr
