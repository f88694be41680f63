"""`gpuwarden monitor`: the summary against the fake's known series, and the CLI as a user runs it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from statistics import mean

import pytest

from gpuwarden.core.monitor import SummaryAccumulator
from gpuwarden.core.telemetry.fake_nvml import FakeNvml
from gpuwarden.core.telemetry.nvml import NvmlReader
from gpuwarden.core.telemetry.sampler import Sampler
from tests import preloaded


def _drive(scenario: str, seconds: int) -> tuple[FakeNvml, dict[str, object], list[float]]:
    fake = FakeNvml(scenario)
    reader = NvmlReader(fake)
    sampler = Sampler(reader, None, process_interval=5.0, clock=lambda: fake.time)
    acc = SummaryAccumulator({g.uuid: (g.index, g.name) for g in sampler.gpus()})
    times = []
    for _ in range(seconds):
        times.append(fake.time)
        acc.add(sampler.tick())
        fake.advance(1.0)
    return fake, acc.summary(), times


def test_summary_matches_the_fake_series() -> None:
    # GeForce: no sub-second samples, so the summary's utilisation is NVML's own reading, which the
    # fake defines exactly.
    fake, summary, times = _drive("geforce-12gbx2", 20)
    gpus = summary["gpus"]
    assert isinstance(gpus, list) and len(gpus) == 2
    for g in gpus:
        i = g["index"]
        utils = [fake.util_gpu(i, t) for t in times]
        powers = [fake.power_mw(i, t) / 1000 for t in times]
        limit = 170.0  # RTX 3060 enforced limit
        assert g["util_mean"] == pytest.approx(mean(utils))
        assert g["util_peak"] == max(utils)
        assert g["power_mean_w"] == pytest.approx(mean(powers))
        assert g["power_limit_w"] == pytest.approx(limit)
        assert g["power_pct_mean"] == pytest.approx(100 * mean(powers) / limit)
        assert g["energy_j"] == pytest.approx(
            (fake.energy_mj(i, times[-1]) - fake.energy_mj(i, times[0])) / 1000
        )
        assert g["energy_source"] == "counter"
        # the fake reports the SW power cap (0x4) exactly while utilisation is 100 %
        assert g["throttled_s"] == pytest.approx(sum(1.0 for t in times[1:] if fake.util_gpu(i, t) == 100))
        assert g["mem_pct_peak"] is not None and g["mem_pct_peak"] < 5
    # mean utilisation of the fake pattern is 49 %: power well under the limit → underused, with numbers
    g0 = gpus[0]
    assert g0["verdict"] == "underused"
    assert any(r.startswith("power ") and "% of limit" in r for r in g0["reasons"])
    assert any(r.startswith("memory ") for r in g0["reasons"])


def test_a_lost_gpu_is_counted_and_the_other_goes_on() -> None:
    fake = FakeNvml("lost", lost_after=3)
    reader = NvmlReader(fake)
    sampler = Sampler(reader, None, process_interval=5.0, clock=lambda: fake.time)
    acc = SummaryAccumulator({g.uuid: (g.index, g.name) for g in sampler.gpus()})
    for _ in range(10):
        acc.add(sampler.tick())
        fake.advance(1.0)
    by_index = {g["index"]: g for g in acc.summary()["gpus"]}
    assert by_index[0]["lost_samples"] == 0 and by_index[0]["samples"] == 10
    assert by_index[1]["lost_samples"] >= 6
    assert by_index[1]["samples"] == 10


def _cli(*args: str, fake: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    if fake:
        env["GPUWARDEN_FAKE_NVML"] = fake
    return preloaded.run([sys.executable, "-m", "gpuwarden", *args], env=env, timeout=60)


def test_monitor_json_host_only() -> None:
    r = _cli("monitor", "--duration", "1", "--interval", "0.25", "--json", fake="none")
    assert r.returncode == 0, r.stderr
    assert "no NVIDIA driver found: sampling the host only" in r.stderr
    out = json.loads(r.stdout)
    assert out["status"] == "no NVIDIA driver found: sampling the host only"
    assert out["gpus"] == [] and out["summary"]["gpus"] == []
    assert out["summary"]["host"]["samples"] == len(out["samples"]) >= 4
    assert out["summary"]["host"]["mem_total"] > 0


def test_monitor_json_with_fake_gpus_is_self_consistent() -> None:
    r = _cli("monitor", "--duration", "2", "--interval", "0.25", "--json", "--gpu", "1", fake="h100x2")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [g["index"] for g in out["gpus"]] == [1]
    samples = [s["gpus"][0] for s in out["samples"]]
    assert all(len(s["gpus"]) == 1 for s in out["samples"])
    (g,) = out["summary"]["gpus"]
    assert g["util_mean"] == pytest.approx(mean(s["util_gpu_fine"] or s["util_gpu"] for s in samples))
    assert g["power_peak_w"] == max(s["power_w"] for s in samples)
    assert g["power_peak_w"] <= g["power_limit_w"]


def test_monitor_jsonl_streams_then_summarises() -> None:
    r = _cli("monitor", "--duration", "1", "--interval", "0.5", "--jsonl", fake="h100")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["type"] for x in lines[:-1]] == ["sample"] * (len(lines) - 1)
    assert lines[-1]["type"] == "summary" and len(lines) >= 3


def test_monitor_human_output_has_summary_and_verdict() -> None:
    r = _cli("monitor", "--duration", "1", "--interval", "0.5", fake="geforce-12gb")
    assert r.returncode == 0, r.stderr
    assert "[0] NVIDIA GeForce RTX 3060" in r.stdout
    assert "summary over" in r.stdout
    assert any(v in r.stdout for v in (": underused:", ": idle:", ": good:", ": throttled:"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "7"], "--gpu 7: matches no GPU — use an index or UUID from: 0 ("),
        (["--interval", "-1"], "Invalid value for '--interval'"),
        (["--interval", "nan"], "Invalid value for '--interval': 'nan' is not a number of seconds"),
        (["--interval", "1e308"], "Invalid value for '--interval': 1e+308 is not in the range 0.05<=x<=3600"),
        (["--json", "--jsonl"], "--json and --jsonl: pick one"),
        (["--duration", "abc"], "Invalid value for '--duration': 'abc' is not a number — see"),
        (["--db", "/tmp/x.db"], "--db is where --record stores the samples: add --record, or leave --db out"),
        (
            ["--record", "--db", "/proc/gpuwarden.db"],
            "/proc/gpuwarden.db: cannot create the database there (",
        ),
    ],
)
def test_monitor_bad_input_is_one_line(args: list[str], message: str) -> None:
    r = _cli("monitor", "--duration", "1", *args, fake="h100")
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_a_gpu_named_where_there_is_none_is_told_to_leave_gpu_out() -> None:
    r = _cli("monitor", "--duration", "1", "--gpu", "0", fake="none")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.endswith(
        "gpuwarden: --gpu 0: this machine has no GPU that NVML sees — leave --gpu out\n"
    ), r.stderr


def test_monitor_record_stores_history(tmp_path: Path) -> None:
    db = tmp_path / "new" / "g.db"  # its folder made, owner-only
    r = _cli(
        "monitor", "--duration", "1", "--interval", "0.25", "--record", "--db", str(db), "--json", fake="h100"
    )
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    from gpuwarden.core.store.db import open_db
    from gpuwarden.core.store.telemetry import TelemetryStore

    store = TelemetryStore(open_db(db, readonly=True))
    latest = store.latest()
    assert len(latest) == 1
    samples = json.loads(r.stdout)["samples"]
    start, end = samples[0]["ts"] - 1, samples[-1]["ts"] + 1
    hist = store.history(None, ["util_gpu"], start, end, points=1000)
    assert hist.tier == "raw"
    (series,) = hist.series.values()
    assert [round(p[1]) for p in series["util_gpu"]] == [round(s["gpus"][0]["util_gpu"]) for s in samples]


def test_gpus_json() -> None:
    r = _cli("gpus", "--json", fake="none")
    assert r.returncode == 0
    assert json.loads(r.stdout) == {"gpus": [], "reason": "no NVIDIA driver found: sampling the host only"}
    r = _cli("gpus", "--json", fake="geforce-12gb")
    (g,) = json.loads(r.stdout)["gpus"]
    assert g["name"] == "NVIDIA GeForce RTX 3060" and g["memory_total"] == 12 * 1024**3
    assert g["sample"]["util_gpu_fine"] is None  # GetSamples is NotSupported on this card
