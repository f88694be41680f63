"""`build_report` and `compare_reports` against recorded series with known answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuwarden.cli.report_format import render_markdown, render_text
from gpuwarden.core.report.compare import compare_reports
from gpuwarden.core.report.db_data import DbRunData
from gpuwarden.core.report.performance import build_report
from gpuwarden.core.report.snapshot import collect_run
from tests.report.builders import GIB, RTX5090, T0, Recorder, captcha_spec, training_events


def _steady(power: float) -> Any:
    return lambda i: {
        "power_w": power,
        "power_limit_w": 575.0,
        "util_gpu": 95.0,
        "util_gpu_fine": 95.0,
        "mem_used": 6 * GIB,
        "energy_w": power,
        "throttle_reasons": 0,
        "temperature_c": 60.0,
    }


def record_captcha_run(rec: Recorder, run_id: str, start: float, power: float, per_s: int) -> None:
    """120 s of CAPTCHA training on the 575 W card; one sample before the window seeds the
    energy counter, so the window holds exactly 120 one-second energy deltas."""
    rec.samples(RTX5090, start - 1, 121, _steady(power), host_cpu=lambda i: 40.0)
    rec.run(
        run_id,
        {**captcha_spec(per_s), "name": run_id},
        [(start, start + 120, [RTX5090.uuid], 1000)],
        {1: training_events(start, 120, per_s, per_s)},
    )


def _report(path: Path, ref: str) -> dict[str, Any]:
    data = DbRunData(path)
    try:
        return build_report(collect_run(data, ref))
    finally:
        data.close()


def test_captcha_report_has_exact_throughput_energy_power_and_memory(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "g.db")
    record_captcha_run(rec, "before", T0, 300.0, 256)
    r = _report(tmp_path / "g.db", "before")
    tp = r["throughput"]
    # progress every 10 s from +10 to +110: 11 events, 2560 samples apart
    assert tp["samples"] == 28160 and tp["samples_per_s"] == pytest.approx(256.0)
    assert tp["samples_per_s_wall"] == pytest.approx(28160 / 120) and tp["unit"] == "samples"
    assert r["wall_s"] == pytest.approx(120.0)
    assert r["per_batch_size"] == {
        "256": {
            "steps": 100,
            "mean_step_s": pytest.approx(1.0),
            "samples": 25600,
            "samples_per_s": pytest.approx(256.0),
        }
    }
    assert r["energy"]["joules"] == pytest.approx(120 * 300.0)
    assert r["energy"]["per_sample_j"] == pytest.approx(36000 / 28160)
    assert r["energy"]["samples_per_kwh"] == pytest.approx(3.6e6 * 28160 / 36000)
    assert r["energy"]["per_attempt"] == [
        {
            "attempt": 1,
            "joules": pytest.approx(36000.0),
            "samples": 28160,
            "per_sample_j": pytest.approx(36000 / 28160),
            "samples_per_kwh": pytest.approx(3.6e6 * 28160 / 36000),
        }
    ]
    assert r["power"]["mean_w"] == pytest.approx(300.0) and r["power"]["limit_w"] == pytest.approx(575.0)
    assert r["power"]["mean_pct"] == pytest.approx(100 * 300 / 575)
    assert r["utilisation"]["metric"] == "util_gpu_fine" and r["utilisation"]["mean"] == pytest.approx(95.0)
    assert r["memory"]["gpu_used_peak_bytes"] == 6 * GIB and r["memory"]["capacity_bytes"] == 32 * GIB
    assert r["memory"]["peak_pct"] == pytest.approx(100 * 6 / 32)
    assert r["memory"]["runner_peak_bytes"] == 5 * GIB
    assert r["run"]["device"] == "cuda:0" and r["loss"] == {"first": 1.0, "last": 0.1}
    assert r["telemetry_tier_s"] == pytest.approx(1.0)


def test_distributions_are_mean_p50_p90_max_of_the_window(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "g.db")
    rec.samples(
        RTX5090,
        T0,
        100,
        lambda i: {"power_w": 100.0 + i, "power_limit_w": 400.0, "util_gpu": float(i % 10 * 10)},
    )
    rec.run("d", captcha_spec(), [(T0, T0 + 100, [RTX5090.uuid], 1)], {1: training_events(T0, 100, 8, 8)})
    r = _report(tmp_path / "g.db", "d")
    assert r["power"] == pytest.approx(
        {
            "n": 100,
            "mean_w": 149.5,
            "p50_w": 149.5,
            "p90_w": 189.1,
            "max_w": 199.0,
            "limit_w": 400.0,
            "mean_pct": 149.5 / 4,
        }
    )
    # no sub-second utilisation in this series: the report falls back to util_gpu
    assert r["utilisation"]["metric"] == "util_gpu"
    # 0, 10, …, 90 ten times each: p90 interpolates between the 90th (80) and 91st (90) values
    assert r["utilisation"]["mean"] == pytest.approx(45.0) and r["utilisation"]["p90"] == pytest.approx(81.0)
    assert r["energy"]["joules"] is None  # no energy counter in this series


def test_attempts_retunes_and_per_batch_size_across_a_retune(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "g.db")
    rec.samples(RTX5090, T0, 130, _steady(400.0))
    first = training_events(T0, 60, 256, 256)[:-1]  # out of memory: no finished event
    second = training_events(T0 + 70, 60, 128, 128)
    rec.run(
        "r",
        captcha_spec(),
        [(T0, T0 + 60, [RTX5090.uuid], 1), (T0 + 70, T0 + 130, [RTX5090.uuid], 2)],
        {1: first, 2: second},
    )
    rec.runs.add_retune(
        "r", 1, {"batch_size": 256}, {"batch_size": 128, "grad_accum_steps": 2}, verdict="gpu_capacity"
    )
    rec.runs.set_retune_outcome("r", "succeeded")
    r = _report(tmp_path / "g.db", "r")
    # each attempt: progress at +10…+50, four 10-step intervals
    assert r["per_batch_size"]["256"]["steps"] == 40 and r["per_batch_size"]["128"]["steps"] == 40
    assert r["per_batch_size"]["128"]["samples_per_s"] == pytest.approx(128.0)
    assert r["throughput"]["samples"] == 5 * 10 * 256 + 5 * 10 * 128
    assert r["throughput"]["samples_per_s"] == pytest.approx((40 * 256 + 40 * 128) / 80)
    assert [a["classification"] for a in r["attempts"]] == ["oom", "succeeded"]
    assert r["wall_s"] == pytest.approx(120.0) and r["span_s"] == pytest.approx(130.0)
    assert r["retunes"] == [
        {
            "attempt": 1,
            "from": {"batch_size": 256},
            "to": {"batch_size": 128, "grad_accum_steps": 2},
            "verdict": "gpu_capacity",
            "outcome": "succeeded",
        }
    ]
    # energy only inside the attempts' windows: the 10 s between them are not the run's
    assert r["energy"]["joules"] == pytest.approx(400.0 * 119)
    per_attempt = r["energy"]["per_attempt"]
    assert [a["samples"] for a in per_attempt] == [5 * 10 * 256, 5 * 10 * 128]
    assert sum(a["joules"] for a in per_attempt) == pytest.approx(400.0 * 119)
    # the same power for half the samples: the retuned attempt's samples cost about twice as much
    assert per_attempt[1]["per_sample_j"] / per_attempt[0]["per_sample_j"] == pytest.approx(2.0, rel=0.02)
    # as `gpuwarden report` prints it: the retune as one change, not two dictionaries
    text = render_text(r)
    assert "after  verdict       change  " in text
    assert "1      gpu_capacity  batch_size 256 → 128, grad_accum_steps – → 2  succeeded" in text
    assert (
        "| 1 | gpu_capacity | batch_size 256 → 128, grad_accum_steps – → 2 | succeeded |"
        in render_markdown(r)
    )


def test_compare_gives_b_over_a_ratios(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "g.db")
    record_captcha_run(rec, "before", T0, 300.0, 256)
    record_captcha_run(rec, "after", T0 + 7200, 450.0, 512)
    result = compare_reports(_report(tmp_path / "g.db", "before"), _report(tmp_path / "g.db", "after"))
    rows = {row["metric"]: row for row in result["rows"]}
    assert rows["samples_per_s"]["ratio"] == pytest.approx(2.0)
    assert rows["power_mean_w"]["ratio"] == pytest.approx(1.5)
    assert rows["power_pct_of_limit"]["a"] == pytest.approx(100 * 300 / 575)
    # 1.5× the power for 2× the samples: each sample costs 0.75× the energy
    assert rows["energy_per_sample_j"]["ratio"] == pytest.approx(0.75)
    assert rows["samples_per_kwh"]["ratio"] == pytest.approx(1 / 0.75)
    assert rows["samples_per_kwh"]["higher_is_better"] is True
    assert rows["wall_s"]["ratio"] == pytest.approx(1.0) and rows["util_mean_pct"]["ratio"] == pytest.approx(
        1.0
    )
    assert rows["tokens_per_s"]["ratio"] is None
    assert result["a"]["name"] == "before" and result["b"]["name"] == "after"


def test_cpu_run_has_no_energy_or_power(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "g.db")
    events = training_events(T0, 60, 4, 4)
    events[0]["device"] = "cpu"
    rec.run("cpu", {**captcha_spec(4), "name": "cpu"}, [(T0, T0 + 60, [], 7)], {1: events})
    r = _report(tmp_path / "g.db", "cpu")
    assert r["energy"] == {
        "joules": None,
        "samples": None,
        "per_sample_j": None,
        "samples_per_kwh": None,
        "per_token_j": None,
        "per_attempt": [
            {"attempt": 1, "joules": None, "samples": 200, "per_sample_j": None, "samples_per_kwh": None}
        ],
    }
    assert r["energy"]["per_attempt"][0]["samples"] == r["throughput"]["samples"]
    assert r["power"]["mean_w"] is None and r["memory"]["runner_peak_kind"] == "host_rss"
    assert r["memory"]["peak_pct"] is None and r["throughput"]["samples_per_s"] == pytest.approx(4.0)
    # as `gpuwarden report` prints it: one "n/a" for each reading a CPU run cannot have
    lines = dict(line.split("  ", 1) for line in render_text(r).splitlines()[:11])
    assert {k.strip(): v.strip() for k, v in lines.items() if k.strip() in {"energy", "power"}} == {
        "energy": "n/a",
        "power": "n/a",
    }
    memory_line = render_text(r).split("peak memory", 1)[1].splitlines()[0]
    assert "n/a" not in memory_line
    assert "the runner's peak resident memory" in memory_line and "host_rss" not in memory_line


def test_a_command_run_that_reports_nothing_reads_n_a_once_per_row(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "g.db")
    spec = {"version": 1, "name": "script", "kind": "command", "command": {"argv": ["true"]}}
    rec.run("script", spec, [(T0, T0 + 30, [], 0)], {1: []}, kind="command")
    rows = dict(
        line.split("  ", 1) for line in render_text(_report(tmp_path / "g.db", "script")).splitlines()[:11]
    )
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    assert rows["run"] == "script (script) — command, succeeded"
    assert rows["samples"] == "n/a (the run reported no progress)"
    assert rows["samples/s"] == rows["loss"] == rows["peak memory"] == "n/a"
    assert rows["device"] == "cpu"  # where its attempt ran (no GPU given), though it said nothing
