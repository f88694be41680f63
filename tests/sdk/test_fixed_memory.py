"""The memory a training process holds whatever its micro-batch, as the SDK measures it: weights
held, gradients and optimizer state to come — a bound that must never overstate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gpuwarden.sdk.fixed_memory import HOST_FRESH_MAPPING, measure
from gpuwarden.sdk.reporter import Reporter

BIG = 4096 * 4096 * 4  # one 4096 × 4096 fp32 weight: 64 MiB, a fresh mapping when allocated


def _model() -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.Linear(16, 16))


def test_gradients_and_adam_state_to_come_are_counted_once_they_exist_no_more() -> None:
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters())
    before = measure(model, [optimizer])
    assert before is not None and before.device == "cpu"
    assert before.parameters == 4096 * 4096 + 4096 + 16 * 16 + 16
    # On the host only tensors of 32 MiB or more surely grow the address space: the big weight.
    assert BIG >= HOST_FRESH_MAPPING
    assert before.gradient_bytes == BIG and before.optimizer_state_bytes == 2 * BIG
    assert before.fixed_bytes == before.held_bytes + 3 * BIG
    model[0](torch.randn(2, 4096)).sum().backward()
    model[1](torch.randn(2, 16)).sum().backward()
    optimizer.step()
    after = measure(model, [optimizer])
    assert after is not None and after.gradient_bytes == 0 and after.optimizer_state_bytes == 0


def test_optimizers_without_state_frozen_weights_and_wrappers() -> None:
    model = _model()
    plain = measure(model, [torch.optim.SGD(model.parameters(), lr=0.1)])
    momentum = measure(
        model, [SimpleNamespace(optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))]
    )
    assert plain is not None and plain.optimizer_state_bytes == 0
    assert momentum is not None and momentum.optimizer_state_bytes == BIG  # found under the wrapper
    for p in model[0].parameters():
        p.requires_grad_(False)
    frozen = measure(model, [torch.optim.AdamW(model[1].parameters())])
    assert frozen is not None and frozen.gradient_bytes == 0 and frozen.optimizer_state_bytes == 0
    assert measure(torch.nn.Linear(4, 4, device="meta")) is None  # no memory of its own to speak of
    # Split over devices: only the weights where the first ones live add to the memory measured.
    split = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.Linear(4096, 4096, device="meta"))
    here = measure(split, [torch.optim.AdamW(split.parameters())])
    assert here is not None and here.parameters == 4096 * 4096 + 4096
    assert here.gradient_bytes == BIG and here.optimizer_state_bytes == 2 * BIG
    assert measure(torch.nn.ReLU()) is None


def test_a_reporter_outside_gpuwarden_writes_nothing_and_inside_one_line(tmp_path: Path) -> None:
    model = _model()
    Reporter(path=None).fixed_memory(model, [])
    events = tmp_path / "events.jsonl"
    Reporter(path=str(events)).fixed_memory(model, [torch.optim.AdamW(model.parameters())])
    (line,) = events.read_text().splitlines()
    event = json.loads(line)
    assert event["type"] == "fixed_memory" and event["device"] == "cpu"
    assert event["fixed_bytes"] == event["held_bytes"] + 3 * BIG


TRAIN_AND_READ_PEAK = """
import json, torch
from gpuwarden.sdk.fixed_memory import measure
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(3)])
optimizer = torch.optim.AdamW(model.parameters())
fixed = measure(model, [optimizer]).fixed_bytes
for _ in range(2):
    model(torch.randn(4, 4096)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
status = open("/proc/self/status").read().split("VmPeak:")[1].split()[0]
print(json.dumps({"fixed": fixed, "vm_peak": int(status) * 1024}))
"""


@pytest.mark.slow
def test_the_bound_stays_below_the_peak_a_real_step_reaches() -> None:
    """Measured in a fresh process before training, compared with the address space its steps
    then reached: the bound is under the peak, and close to it (only activations are missing)."""
    env = {"OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", TRAIN_AND_READ_PEAK], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout)
    assert figures["fixed"] <= figures["vm_peak"]
    assert figures["fixed"] >= 0.85 * figures["vm_peak"]
