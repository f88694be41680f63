"""Energy as a tuning goal: joules per sample from the energy counter, the three objectives, and the
opt-in power-limit sweep — on the fake NVML with synthetic power curves."""

from __future__ import annotations

import math
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.errors import UserError
from gpuwarden.core.telemetry.fake_nvml import FakeNvml
from gpuwarden.core.telemetry.nvml import NvmlReader
from gpuwarden.core.telemetry.types import GpuStatic
from gpuwarden.core.tune.cache import TuneCache
from gpuwarden.core.tune.energy import EnergyTrace, GpuEnergyCounter
from gpuwarden.core.tune.objective import samples_per_kwh, score
from gpuwarden.core.tune.power import CommandPowerLimiter, NvmlPowerLimiter, power_sweep, sweep_levels
from gpuwarden.core.tune.search import Candidate, ProbeResult, Search
from gpuwarden.core.tune.session import tune_spec
from gpuwarden.core.tune.target import pick_target

GB = 10**9


def _reader(fake: FakeNvml) -> NvmlReader:
    return NvmlReader(fake, enrich=lambda rows: None)


def _wait(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_trace_gives_the_joules_between_two_moments() -> None:
    """The counter read at known moments (a clock the test moves: the machine's load cannot shift a
    reading's time), and the joules between two moments interpolated from it."""
    now = [1000.0]
    fake = FakeNvml("h100", clock=lambda: now[0])
    fake.set_load(0, util=90, power_w=300)
    trace = EnergyTrace(GpuEnergyCounter(_reader(fake), fake.uuid(0)), interval=3600, clock=lambda: now[0])
    for _ in range(6):
        trace._read()
        now[0] += 0.25
    t0, t1 = trace.times[1], trace.times[-2]
    middle = (t0 + t1) / 2 + 0.1  # between two readings
    assert trace.joules(t0, t1) == pytest.approx(300 * (t1 - t0), rel=1e-6)
    assert trace.joules(t0, middle) == pytest.approx(300 * (middle - t0), rel=1e-6)
    assert trace.joules(t0 - 60, t1) is None  # before the trace began: unknown, not guessed


def test_the_trace_reads_on_its_own_while_the_block_runs() -> None:
    fake = FakeNvml("h100", clock=time.time)
    fake.set_load(0, util=90, power_w=300)
    with EnergyTrace(GpuEnergyCounter(_reader(fake), fake.uuid(0)), interval=0.01) as trace:
        _wait(lambda: len(trace.times) >= 6)
    assert trace.times == sorted(trace.times) and trace.values == sorted(trace.values)
    joules = trace.joules(trace.times[0], trace.times[-1])
    assert joules is not None and joules > 0


def test_a_counter_that_restarts_is_not_joined_across_the_restart() -> None:
    values = iter([5000, 6000, 10, 1010])

    class Counter:
        def read_mj(self) -> int | None:
            return next(values, None)

    trace = EnergyTrace(Counter(), interval=3600)
    trace._read()
    trace._read()
    trace._read()
    trace._read()
    assert trace.values == [10.0, 1010.0]


def test_objectives_score_speed_energy_and_both() -> None:
    assert score("throughput", 100.0, None) == 100.0
    assert score("energy", 100.0, None) is None
    assert score("energy", 100.0, 2.0) == 0.5
    assert score("balanced", 100.0, 2.0) == 50.0
    assert samples_per_kwh(2.0) == 1.8e6


class PoweredMachine:
    """Throughput saturates past micro-batch 30 or so while power keeps rising with the
    micro-batch up to 64: the fastest configuration is not the one that spends least energy per
    sample (that one is near 12)."""

    def __init__(self) -> None:
        self.calls: list[Candidate] = []

    @staticmethod
    def speed(b: int) -> float:
        return 1000.0 * (1 - math.exp(-b / 8))

    @staticmethod
    def power(b: int) -> float:
        return 100.0 + 600.0 * min(1.0, b / 64)

    def __call__(self, c: Candidate) -> ProbeResult:
        self.calls.append(c)
        rate, watts = self.speed(c.batch_size), self.power(c.batch_size)
        return ProbeResult(
            c,
            ok=True,
            samples_per_s=rate,
            mem_peak=GB,
            wall_s=10.0,
            joules_per_sample=watts / rate,
            power_w=watts,
        )


def _pick(objective: str) -> ProbeResult:
    result = Search(PoweredMachine(), capacity=80 * GB, objective=objective).run(  # type: ignore[arg-type]
        Candidate(2, 128, "fp32", False), per_device_batch=256
    )
    assert result.best is not None and result.objective == objective
    return result.best


def test_the_energy_objective_picks_a_different_batch_than_throughput() -> None:
    fast, frugal, both = _pick("throughput"), _pick("energy"), _pick("balanced")
    assert frugal.candidate.batch_size < fast.candidate.batch_size
    assert frugal.joules_per_sample is not None and fast.joules_per_sample is not None
    assert frugal.joules_per_sample < 0.8 * fast.joules_per_sample
    assert fast.samples_per_s is not None and frugal.samples_per_s is not None
    assert fast.samples_per_s > 1.2 * frugal.samples_per_s
    assert frugal.candidate.batch_size <= both.candidate.batch_size <= fast.candidate.batch_size
    assert fast.to_dict()["samples_per_kwh"] == pytest.approx(3.6e6 / fast.joules_per_sample)


def test_without_energy_readings_the_energy_objective_picks_nothing() -> None:
    def probe(c: Candidate) -> ProbeResult:
        return ProbeResult(c, ok=True, samples_per_s=100.0, wall_s=1.0)

    result = Search(probe, capacity=None, objective="energy").run(
        Candidate(4, 1, "fp32", False), per_device_batch=4
    )
    assert result.best is None
    assert "gave no energy reading" in result.stopped_because


def _spec(**extra: object) -> object:
    return spec_from_mapping(
        {
            "name": "energy",
            "kind": "train",
            "resources": {"gpus": 0},
            "train": {"task": "image", "batch_size": 2, "grad_accum_steps": 2},
            **extra,
        }
    )


def test_an_energy_objective_on_the_cpu_is_refused_before_any_probe(tmp_path: Path) -> None:
    spec = _spec(tune={"objective": "energy"})
    target = pick_target(spec, [])  # type: ignore[arg-type]
    with pytest.raises(
        UserError, match=r"energy objective needs joules per sample, but on the CPU there is no"
    ):
        tune_spec(spec, target, TuneCache(tmp_path / "c"), tmp_path, env={})  # type: ignore[arg-type]
    with pytest.raises(UserError, match="balanced objective"):
        tune_spec(spec, target, TuneCache(tmp_path / "c"), tmp_path, env={}, objective="balanced")  # type: ignore[arg-type]
    assert not any(tmp_path.glob("tune-*"))  # nothing was probed


def test_a_spec_rejects_an_unknown_objective() -> None:
    with pytest.raises(UserError, match=r"tune\.objective"):
        _spec(tune={"objective": "cheapest"})


def _limit_machine(fake: FakeNvml) -> object:
    """Probes whose speed and power follow the fake GPU's current power limit: below 700 W the
    card slows a little and saves a lot (speed ∝ limit^0.3, power = the limit)."""
    handle = fake.nvmlDeviceGetHandleByIndex(0)

    def probe(c: Candidate) -> ProbeResult:
        limit = fake.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000
        assert c.power_limit_w in (None, limit)
        rate = 1000.0 * (limit / 700) ** 0.3
        return ProbeResult(c, ok=True, samples_per_s=rate, joules_per_sample=limit / rate, wall_s=1.0)

    return probe


def test_the_power_sweep_finds_a_lower_limit_and_puts_the_original_back() -> None:
    fake = FakeNvml("h100")
    reader = _reader(fake)
    fake.allow_power_limit = True
    gpu = reader.gpus()[0]
    probe = _limit_machine(fake)
    best = probe(Candidate(16, 1, "bf16", False))  # type: ignore[operator]
    limiter = NvmlPowerLimiter(reader, gpu.uuid)
    result = power_sweep(probe, best, limiter, gpu, "energy", 0.05)  # type: ignore[arg-type]
    assert [t["candidate"]["power_limit_w"] for t in result["trials"]] == sweep_levels(gpu, 700.0)
    assert result["best_w"] == min(sweep_levels(gpu, 700.0)) == 350.0
    assert "nvidia-smi -i 0 -pl 350" in result["recommendation"]
    assert reader.power_limit_w(gpu.uuid) == 700.0  # restored
    throughput = power_sweep(probe, best, limiter, gpu, "throughput", 0.05)  # type: ignore[arg-type]
    assert throughput["best_w"] == 700.0 and "keep the power limit at 700 W" in throughput["recommendation"]


def test_without_permission_the_sweep_says_what_it_needs() -> None:
    fake = FakeNvml("h100")
    reader = _reader(fake)
    gpu = reader.gpus()[0]
    probe = _limit_machine(fake)
    best = probe(Candidate(16, 1, "bf16", False))  # type: ignore[operator]
    with pytest.raises(UserError) as err:
        power_sweep(probe, best, NvmlPowerLimiter(reader, gpu.uuid), gpu, "energy", 0.05)  # type: ignore[arg-type]
    assert "needs permission to change GPU 0's limit (NVML refuses" in str(err.value)
    assert "power_limit_command" in str(err.value) and "run tune as root" in str(err.value)


def test_the_helper_command_gets_the_gpu_and_the_watts() -> None:
    gpu = GpuStatic(uuid="GPU-x", index=3, name="card")
    seen: list[list[str]] = []

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        seen.append(argv)
        code = 0 if argv[-1] != "123" else 1
        return subprocess.CompletedProcess(argv, code, "", "sudo: a password is required\n")

    limiter = CommandPowerLimiter("sudo -n nvidia-smi -i {index} -pl {watts}", gpu, lambda: 300.0, run=run)
    assert limiter.set_limit_w(250.4) is None
    assert seen[-1] == ["sudo", "-n", "nvidia-smi", "-i", "3", "-pl", "250"]
    assert limiter.set_limit_w(123) == "power_limit_command exited 1: sudo: a password is required"
    missing = CommandPowerLimiter("/nonexistent/helper {watts}", gpu, lambda: 300.0)
    assert "could not run" in (missing.set_limit_w(200) or "")


def test_sweep_levels_stay_within_the_card() -> None:
    gpu = GpuStatic(
        uuid="GPU-x",
        index=0,
        name="card",
        power_limit_default_w=170,
        power_limit_min_w=100,
        power_limit_max_w=170,
    )
    assert sweep_levels(gpu, 170.0) == [147.0, 123.0, 100.0]
    assert sweep_levels(replace(gpu, power_limit_min_w=170), 170.0) == []


def test_the_summary_names_the_cost_the_objective_the_noise_and_the_sweep() -> None:
    from gpuwarden.core.tune.session import TuneOutcome

    best = ProbeResult(Candidate(8, 4, "bf16", True), ok=True, samples_per_s=500.0, joules_per_sample=0.5)
    result = {
        "best": best.to_dict(),
        "trials": [best.to_dict()] * 6,
        "objective": "energy",
        "stopped_because": "micro-batch 24 gained -8.0 % (< 5 %)",
        "noise": {"repeat_spread": 0.031, "step_spread": 0.012},
        "power_sweep": {"ran": False, "needs": "a power-limit sweep (--power-sweep) needs permission"},
    }
    summary = TuneOutcome("fp", False, {}, result).summary
    assert summary == (
        "micro-batch 8 × 4, bf16, compile: 500.00 samples/s, 0.5 J/sample (7,200,000 samples/kWh); 6 probes, "
        "objective energy; stopped: micro-batch 24 gained -8.0 % (< 5 %); noise seen: repeated readings apart "
        "by 3.1 %, steps within a probe 1.2 %\na power-limit sweep (--power-sweep) needs permission"
    )
