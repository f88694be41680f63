"""Choosing a GPU reader: fake scenarios, no driver, broken bindings, init retries."""

from __future__ import annotations

import ctypes.util
import sys
import types

import pytest

from gpuwarden.core.errors import UserError
from gpuwarden.core.telemetry.fake_nvml import FakeNvml
from gpuwarden.core.telemetry.nvml import (
    FAKE_ENV,
    MISMATCH_STATUS,
    NOT_INSTALLED_STATUS,
    NoGpuReader,
    NvmlReader,
    open_gpu_reader,
)

NO_DRIVER = "no NVIDIA driver found: sampling the host only"


@pytest.fixture(autouse=True)
def _no_fake_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FAKE_ENV, raising=False)


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has NVML")
def test_real_nvml_without_driver_samples_the_host_only() -> None:
    reader = open_gpu_reader()
    assert isinstance(reader, NoGpuReader)
    assert reader.status == NO_DRIVER
    assert reader.gpus() == [] and reader.sample(1.0) == [] and reader.processes(1.0) == []


def test_fake_without_library_gives_the_exact_status() -> None:
    reader = open_gpu_reader("none")
    assert isinstance(reader, NoGpuReader)
    assert reader.status == NO_DRIVER


def test_env_var_selects_a_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAKE_ENV, "h100x2")
    reader = open_gpu_reader()
    assert reader.status is None
    assert [g.name for g in reader.gpus()] == ["NVIDIA H100 80GB HBM3"] * 2
    assert len(reader.sample(0.0)) == 2
    reader.close()


def test_unknown_fake_scenario_is_refused() -> None:
    with pytest.raises(UserError, match="unknown fake NVML scenario 'h200'"):
        open_gpu_reader("h200")


def test_clashing_pynvml_without_device_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    clash = types.ModuleType("pynvml")
    clash.nvmlInit = lambda: None  # type: ignore[attr-defined]
    clash.NVMLError = Exception  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", clash)
    reader = open_gpu_reader()
    assert isinstance(reader, NoGpuReader)
    assert reader.status is not None
    assert reader.status.startswith("the installed `pynvml` module is not NVIDIA's (no nvmlDeviceGetCount;")
    assert reader.status.endswith("sampling the host only")
    assert "\n" not in reader.status


def test_binding_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    reader = open_gpu_reader()
    assert reader.status == NOT_INSTALLED_STATUS


def test_version_mismatch_retries_init_with_back_off() -> None:
    fake = FakeNvml("mismatch")
    reader = NvmlReader(fake, enrich=lambda rows: None)
    assert reader.status == MISMATCH_STATUS and reader.retrying
    assert fake.calls["nvmlInit", -1] == 1
    assert reader.sample(100.0) == []  # first retry at once
    assert reader.sample(104.0) == []  # back-off 5 s
    assert fake.calls["nvmlInit", -1] == 2
    assert reader.sample(105.0) == []
    assert fake.calls["nvmlInit", -1] == 3
    assert reader.sample(114.0) == []  # back-off doubled to 10 s
    assert fake.calls["nvmlInit", -1] == 3
    fake.init_error = None  # the user rebooted
    samples = reader.sample(115.0)
    assert fake.calls["nvmlInit", -1] == 4
    assert reader.status is None and not reader.retrying
    assert [s.uuid for s in samples] == [g.uuid for g in reader.gpus()] == [fake.uuid(0)]


def test_open_gpu_reader_keeps_a_retrying_reader_for_a_mismatch() -> None:
    reader = open_gpu_reader("mismatch")
    assert isinstance(reader, NvmlReader)
    assert reader.status == MISMATCH_STATUS


def test_driver_reporting_no_gpus() -> None:
    reader = open_gpu_reader("no-gpus")
    assert isinstance(reader, NoGpuReader)
    assert reader.status == "the NVIDIA driver reports no GPUs: sampling the host only"
