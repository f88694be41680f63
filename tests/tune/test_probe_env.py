"""A tuning probe of a built-in runner runs in the environment its run's attempts get."""

from __future__ import annotations

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.tune.session import probe_env
from gpuwarden.core.tune.target import Target


def test_a_probe_gets_the_runs_env_over_the_callers_and_the_targets_devices_over_both() -> None:
    spec = spec_from_mapping(
        {
            "name": "threads",
            "kind": "train",
            "env": {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "3"},
            "train": {"task": "image"},
        }
    )
    target = Target({"type": "cuda"}, 80 << 30, {"CUDA_VISIBLE_DEVICES": "GPU-a"}, [], [])
    caller = {"OMP_NUM_THREADS": "4", "HOME": "/home/me"}
    assert probe_env(spec, target, caller) == {
        "OMP_NUM_THREADS": "1",  # the run's thread count, as its attempts run
        "HOME": "/home/me",
        "CUDA_VISIBLE_DEVICES": "GPU-a",  # the device the probe measures, as placement decides
    }
