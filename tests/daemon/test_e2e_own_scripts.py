"""Users' own training scripts recovered end to end: a real daemon, the shipped example specs,
real allocation failures under an address-space limit, and the final weights compared with an
uninterrupted run at the original micro-batch.

What `gpuwarden run --follow` and `show` print is checked as a person reads it; the facts the
recovery stored are read through the API client the CLI uses (the documents `show --json`,
`events --json` and `logs` print, without a Python process for each)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gpuwarden.daemon.process import LocalProcesses
from tests.daemon.conftest import DaemonHandle
from tests.daemon.module_daemon import module_daemon

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "configs" / "examples"
PINNED = {"OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}  # as the example specs pin them
PLAIN_CONFIG = REPO / "examples" / "plain_pytorch" / "config.yaml"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonHandle]:
    """One daemon for the module: every test's run has a name and a folder of its own, and a
    daemon start is one more Python process."""
    with module_daemon(tmp_path_factory.mktemp("daemon")) as handle:
        yield handle


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _reference(tmp: Path, argv: list[str]) -> None:
    """Run a script as a user would, without gpuwarden and without a memory limit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    done = subprocess.run(argv, cwd=REPO, env={**env, **PINNED}, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]


def _assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def plain_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The plain script's weights after an uninterrupted run at micro-batch 16 × 1."""
    tmp = tmp_path_factory.mktemp("plain-reference")
    config = tmp / "config.yaml"
    config.write_text(PLAIN_CONFIG.read_text().replace("output_dir: outputs", f"output_dir: {tmp / 'out'}"))
    _reference(tmp, [sys.executable, "examples/plain_pytorch/train.py", "--config", str(config)])
    state = torch.load(tmp / "out" / "final.pt", weights_only=True)
    assert isinstance(state, dict)
    return state


def _detail(gw: DaemonHandle, ref: str) -> dict[str, Any]:
    """What `gpuwarden show REF --json` prints."""
    with gw.client() as client:
        return client.run(ref).model_dump(mode="json")


def _events(gw: DaemonHandle, run_id: str) -> list[dict[str, Any]]:
    """What `gpuwarden events RUN --json` prints under "events"."""
    with gw.client() as client:
        page = client.events(run_id, since=0, limit=10_000)
    return [e.model_dump(mode="json") for e in page.events]


def _progress_steps(events: list[dict[str, Any]], attempt: int) -> list[int]:
    return [e["step"] for e in events if e["type"] == "progress" and e["attempt"] == attempt]


def _check_recovered_plain(gw: DaemonHandle, name: str, resumed_step: int) -> dict[str, Any]:
    detail = _detail(gw, name)
    assert detail["state"] == "succeeded", detail["message"]
    assert [a["classification"] for a in detail["attempts"]] == ["oom", "succeeded"]
    assert detail["effective_batch"] == 16
    (retune,) = detail["retunes"]
    assert retune["verdict"] == "host_oom"
    assert retune["from"] == {"knobs.batch_size": 16, "knobs.grad_accum": 1}
    assert retune["to"] == {"knobs.batch_size": 8, "knobs.grad_accum": 2}
    first, second = (a["prepared"] for a in detail["attempts"])
    outputs = ["outputs", str(Path(detail["run_dir"]) / "outputs")]  # the run's own folder, every attempt
    assert first["config"]["changes"] == {"training.output_dir": outputs}
    assert first["resume_from"] is None
    assert second["config"]["changes"] == {
        "training.batch_size": [16, 8],
        "training.gradient_accumulation_steps": [1, 2],
        "training.output_dir": outputs,
    }
    assert second["resume_from"].endswith(f"checkpoint-{resumed_step}")
    assert "-  batch_size: 16                    # micro-batch" in second["config"]["diff"]
    assert "+  batch_size: 8                     # micro-batch" in second["config"]["diff"]
    return detail


@pytest.mark.slow
def test_plain_script_with_the_sdk_is_recovered_from_its_own_checkpoint(
    gw: DaemonHandle, plain_reference: dict[str, torch.Tensor]
) -> None:
    before = _sha(PLAIN_CONFIG)
    result = gw.cli("run", str(EXAMPLES / "own-script-plain-cpu.yaml"), "--follow", timeout=500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    detail = _check_recovered_plain(gw, "own-script-plain-cpu", resumed_step=3)
    # No probe process: a probe of the script is a start of it, as costly as the restart, so the
    # restart measures the size the steps before the OOM point to (the largest divisor of 16 below it).
    evidence = detail["retunes"][0]["evidence"]
    assert evidence["probes"] == []
    assert (
        evidence["decided"] == "decided from 3 measured steps, no probe: the restart measures its size itself"
    )
    # The guard saved step 3 at the OOM (the script itself checkpoints every 2 steps).
    assert "attempt 2 resumes from" in result.stderr and "checkpoint-3 (step 3)" in result.stderr
    # No optimizer step redone: attempt 2 starts after the checkpoint and ends at max_steps.
    events = _events(gw, detail["id"])
    assert _progress_steps(events, 1) == [1, 2, 3]
    assert _progress_steps(events, 2) == [4]
    # Nothing of the run is left running (a standby for a third attempt, where it had one).
    assert [t for t in LocalProcesses().tagged() if t.run_id == detail["id"]] == []
    with gw.client() as client:
        logs = client.logs(detail["id"], attempt=2).data
    assert "resumed from" in logs and "at step 3 (48 samples)" in logs
    assert "micro-batch 8 × accumulation 2 = effective batch 16" in logs
    human = gw.cli("show", detail["id"]).stdout
    assert "training.batch_size 16 → 8" in human and "+  batch_size: 8" in human
    recovered = torch.load(Path(detail["run_dir"]) / "outputs" / "final.pt", weights_only=True)
    _assert_same_weights(recovered, plain_reference)
    assert _sha(PLAIN_CONFIG) == before  # the user's file, byte for byte


@pytest.mark.slow
def test_a_script_that_reports_nothing_is_recovered_from_stderr_exit_status_and_its_files(
    gw: DaemonHandle, plain_reference: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    # The same script with its SDK silenced: no events at all, only stderr, the exit status and
    # the checkpoint folders it writes (found by the spec's glob); with no memory figure at all
    # the ladder halves the micro-batch. Nor does its spec name the max_steps role.
    text = (EXAMPLES / "own-script-plain-cpu.yaml").read_text()
    spec = tmp_path / "configs" / "examples" / "silent.yaml"
    spec.parent.mkdir(parents=True)
    spec.write_text(
        text.replace("name: own-script-plain-cpu", "name: silent-script")
        .replace('  MALLOC_ARENA_MAX: "2"\n', '  MALLOC_ARENA_MAX: "2"\n  GPUWARDEN_EVENTS_FILE: ""\n')
        .replace("cwd: ../..", f"cwd: {REPO}")
        .replace("config_file: ../../examples", f"config_file: {REPO}/examples")
        .replace("    max_steps: max_steps ", "    # max_steps: max_steps ")
    )
    result = gw.cli("run", str(spec), "--follow", timeout=500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    detail = _check_recovered_plain(gw, "silent-script", resumed_step=2)
    events = _events(gw, detail["id"])
    assert events  # the daemon's own events only
    assert not [e for e in events if e["source"] == "runner"]
    evidence = detail["retunes"][0]["evidence"]
    assert "DefaultCPUAllocator" in evidence["message"] and evidence["probes"] == []
    recovered = torch.load(Path(detail["run_dir"]) / "outputs" / "final.pt", weights_only=True)
    _assert_same_weights(recovered, plain_reference)


HF_SCRIPT = REPO / "examples" / "hf_trainer" / "finetune.py"


def _hf_args(assets: Path, output_dir: str, micro: int) -> list[str]:
    return [
        str(HF_SCRIPT),
        "--model", str(assets / "train-lm"),
        "--data", str(assets / "ramp-texts.jsonl"),
        "--output_dir", output_dir,
        "--per_device_train_batch_size", str(micro),
        "--max_steps", "4",
        "--save_steps", "2",
        "--logging_steps", "1",
        "--train_sampling_strategy", "sequential",
        "--learning_rate", "1e-3",
        "--use_cpu", "true",
        "--report_to", "none",
        "--disable_tqdm", "true",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpuwarden.runners.testing_models import build_example_assets

    root = tmp_path_factory.mktemp("assets")
    build_example_assets(root)
    return root


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return dict(load_file(str(path)))


@pytest.mark.slow
def test_trainer_script_with_the_preset_alone_recovers_through_run_dash_dash(
    gw: DaemonHandle, assets: Path, tmp_path: Path
) -> None:
    # No callback, no spec file: `gpuwarden run --framework transformers -- python finetune.py …`,
    # its restart started warm (on this machine's two CPUs the default would start it cold).
    result = gw.cli(
        "run", "--framework", "transformers", "--gpus", "0", "--memory-limit", "1.8GiB",
        "--env", "OMP_NUM_THREADS=1", "--env", "MALLOC_ARENA_MAX=2", "--name", "hf-plain", "--follow",
        "--warm-restart", "--", sys.executable, *_hf_args(assets, "out", 16),
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    detail = _detail(gw, "hf-plain")
    assert [a["classification"] for a in detail["attempts"]] == ["oom", "succeeded"]
    # Attempt 2 ran in the interpreter that imported torch and transformers while attempt 1 ran,
    # and nothing of the run is left running once it succeeded (its standby for attempt 3).
    running = [
        e["message"] for e in _events(gw, detail["id"]) if e["type"] == "state" and e["state"] == "running"
    ]
    assert running == [
        "attempt 1: started",
        "attempt 2: started warm: its libraries were imported while the last attempt ran",
    ]
    assert [t for t in LocalProcesses().tagged() if t.run_id == detail["id"]] == []
    assert [a["prepared"]["started_warm"] for a in detail["attempts"]] == [False, True]
    assert (
        "started warm: its libraries were imported while the last attempt ran"
        in gw.cli("show", "hf-plain").stdout
    )
    (retune,) = detail["retunes"]
    assert retune["verdict"] == "host_oom"  # read from stderr: the script reports nothing
    assert retune["from"] == {
        "knobs.per_device_train_batch_size": 16,
        "knobs.gradient_accumulation_steps": 1,
    }
    assert retune["to"] == {"knobs.per_device_train_batch_size": 8, "knobs.gradient_accumulation_steps": 2}
    assert detail["effective_batch"] == 16
    second = detail["attempts"][1]["prepared"]
    out = gw.root / "out"
    assert second["resume_from"] == str(out / "checkpoint-2")  # output_dir/checkpoint-*, complete
    assert second["argv"][-2:] == ["--resume_from_checkpoint", str(out / "checkpoint-2")]
    assert "--resume_from_checkpoint" not in detail["attempts"][0]["prepared"]["argv"]

    reference = tmp_path / "reference"
    _reference(tmp_path, [sys.executable, *_hf_args(assets, str(reference), 16)])
    _assert_same_weights(
        _safetensors(out / "model.safetensors"), _safetensors(reference / "model.safetensors")
    )


@pytest.mark.slow
def test_lightning_script_with_its_callback_is_recovered_from_its_own_checkpoint(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    result = gw.cli("run", str(EXAMPLES / "own-script-lightning-cpu.yaml"), "--follow", timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    detail = _detail(gw, "own-script-lightning-cpu")
    assert [a["classification"] for a in detail["attempts"]] == ["oom", "succeeded"]
    (retune,) = detail["retunes"]
    assert retune["verdict"] == "host_oom"
    assert retune["from"] == {"knobs.batch_size": 16, "knobs.accumulate_grad_batches": 1}
    assert retune["to"] == {"knobs.batch_size": 8, "knobs.accumulate_grad_batches": 2}
    assert detail["effective_batch"] == 16
    second = detail["attempts"][1]["prepared"]
    assert second["resume_from"].endswith("step=3.ckpt")
    assert second["argv"][-4:] == ["--accumulate_grad_batches", "2", "--ckpt_path", second["resume_from"]]
    events = _events(gw, detail["id"])
    oom = [e for e in events if e["type"] == "oom" and e["source"] == "runner"]
    assert oom and oom[0]["verdict"] == "host_oom" and oom[0]["checkpoint"] == second["resume_from"]
    assert _progress_steps(events, 2) == [4]  # only the step after the checkpoint
    fixed = [e["attempt"] for e in events if e["type"] == "fixed_memory" and e["device"] == "cpu"]
    assert fixed == [1, 2]  # the callback's, at each attempt's start
    # Every checkpoint counts the samples before it (16 a step), the one resumed from included.
    checkpoints = [(e["step"], e["samples_seen"]) for e in events if e["type"] == "checkpoint"]
    assert checkpoints and all(samples == 16 * step for step, samples in checkpoints), checkpoints

    reference = tmp_path / "reference"
    _reference(
        tmp_path, [sys.executable, "examples/lightning/train.py", "--default_root_dir", str(reference)]
    )
    recovered = torch.load(Path(detail["run_dir"]) / "outputs" / "final.pt", weights_only=True)
    _assert_same_weights(recovered, torch.load(reference / "final.pt", weights_only=True))


@pytest.mark.slow
def test_an_own_script_run_with_autotune_probes_the_script_then_runs_without_running_out(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    text = (EXAMPLES / "own-script-plain-cpu.yaml").read_text()
    spec = tmp_path / "autotuned.yaml"
    spec.write_text(
        text.replace("name: own-script-plain-cpu", "name: autotuned-script\nautotune: true")
        .replace("cwd: ../..", f"cwd: {REPO}")
        .replace("config_file: ../..", f"config_file: {REPO}")
    )
    result = gw.cli("run", str(spec), "--follow", timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    detail = _detail(gw, "autotuned-script")
    assert detail["state"] == "succeeded", detail["message"]
    # The probes found that 16 × 1 does not fit: the one attempt runs 8 × 2 and never fails.
    assert [a["classification"] for a in detail["attempts"]] == ["succeeded"]
    assert detail["spec"]["knobs"]["batch_size"] == 8 and detail["spec"]["knobs"]["grad_accum"] == 2
    assert detail["effective_batch"] == 16
    (tuned,) = [e for e in _events(gw, detail["id"]) if e["type"] == "autotuned"]
    assert "micro-batch 8 × 2" in tuned["message"] and "probed" in tuned["message"]
    assert detail["attempts"][0]["prepared"]["config"]["changes"]["training.batch_size"] == [16, 8]


# A model too large for its memory whatever the micro-batch: six 4096 × 4096 layers (384 MiB of
# weights) trained with AdamW, whose gradients and state add 768 MiB, under a 1.6 GiB limit.
TOO_LARGE = """\
import argparse

import torch

from gpuwarden import sdk

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, required=True)
parser.add_argument("--grad-accum", type=int, required=True)
args = parser.parse_args()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(6)])
optimizer = torch.optim.AdamW(model.parameters())
sdk.fixed_memory(model, optimizer)
with sdk.oom_guard(batch_size=args.batch_size):
    for step in range(1, 3):
        for _ in range(args.grad_accum):
            model(torch.randn(args.batch_size, 4096)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        sdk.progress(step, step * args.batch_size * args.grad_accum, batch_size=args.batch_size)
"""


@pytest.mark.slow
def test_a_model_whose_weights_and_optimizer_state_alone_do_not_fit_is_not_retuned_in_vain(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    """Smaller micro-batches would each run out again (the weights, gradients and AdamW state
    need 2.1 GiB of the 1.6 GiB): the run ends after its one attempt, saying so and what to do."""
    (tmp_path / "big.py").write_text(TOO_LARGE)
    result = gw.cli(
        "run", "--follow", "--name", "too-large", "--memory-limit", "1.6GiB",
        "--knob", "bs=16", "--knob", "accum=1", "--role", "micro_batch=bs", "--role", "accum_steps=accum",
        "--env", "OMP_NUM_THREADS=1", "--env", "MALLOC_ARENA_MAX=2",
        "--", sys.executable, "big.py", "--batch-size", "{bs}", "--grad-accum", "{accum}",
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0, result.stdout[-3000:] + result.stderr[-3000:]
    detail = _detail(gw, "too-large")
    assert detail["state"] == "failed"
    assert [a["classification"] for a in detail["attempts"]] == ["oom"]
    assert detail["retunes"] == []
    # The weights held vary a little with the machine's libraries; the limit is the spec's.
    said = re.compile(
        r"not retuned: the weights, gradients and optimizer state alone take at least 2\.[12] GiB of "
        r"the 1\.6 GiB that ran out, so no smaller batch or input fits — give the run more memory or "
        r"train a smaller model"
    )
    assert said.search(detail["message"]), detail["message"]
    assert said.search(result.stdout + result.stderr)
    assert re.search(
        r"fixed_memory: at least 2\.[12] GiB whatever the batch: 1\.[01] GiB held, 384 MiB of gradients "
        r"and 768 MiB of optimizer state to come \(100\.7 M parameters, cpu\)",
        result.stderr,
    ), result.stderr
    (fixed,) = [e for e in _events(gw, detail["id"]) if e["type"] == "fixed_memory"]
    assert (
        fixed["attempt"] == 1 and fixed["device"] == "cpu" and fixed["parameters"] == 6 * (4096 * 4096 + 4096)
    )
    assert (
        fixed["gradient_bytes"] == 6 * 4096 * 4096 * 4
    )  # the weight matrices; the biases are too small to count
    assert fixed["optimizer_state_bytes"] == 2 * fixed["gradient_bytes"]


@pytest.mark.slow
def test_an_out_of_memory_in_the_trainers_evaluation_lowers_its_evaluation_batch(
    gw: DaemonHandle, assets: Path, tmp_path: Path
) -> None:
    # Training at micro-batch 4 fits the limit; evaluating the long texts 32 at a time does not.
    evaluated = tmp_path / "eval.jsonl"
    evaluated.write_text("".join((assets / "ramp-texts.jsonl").read_text().splitlines(keepends=True)[-32:]))
    evaluation = ["--eval_data", str(evaluated), "--eval_strategy", "steps", "--eval_steps", "2"]
    argv = [*_hf_args(assets, "eval-out", 4), *evaluation, "--per_device_eval_batch_size", "32"]
    result = gw.cli(
        "run", "--framework", "transformers", "--gpus", "0", "--memory-limit", "1.8GiB",
        "--env", "OMP_NUM_THREADS=1", "--env", "MALLOC_ARENA_MAX=2", "--name", "hf-eval", "--follow",
        "--", sys.executable, *argv, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    detail = _detail(gw, "hf-eval")
    assert detail["state"] == "succeeded" and detail["attempts"][0]["classification"] == "oom"
    first = detail["retunes"][0]
    assert first["from"] == {"knobs.per_device_eval_batch_size": 32}
    assert first["to"] == {"knobs.per_device_eval_batch_size": 16}
    assert (
        "it ran out in evaluation (evaluation_loop), whose batch the training micro-batch"
        in first["evidence"]["decision"]["reason"]
    )
    # Every retune lowered the evaluation's batch alone; the training's settings stayed.
    assert all(set(r["to"]) == {"knobs.per_device_eval_batch_size"} for r in detail["retunes"])
    assert detail["effective_batch"] == 4
    assert (
        "out of memory in evaluation (evaluation_loop) (host: tried 512 MiB) → evaluation batch 32 → 16, "
        "training unchanged" in gw.cli("show", "hf-eval").stdout
    )

    reference = tmp_path / "reference"
    _reference(tmp_path, [sys.executable, *_hf_args(assets, str(reference), 4), *evaluation])
    _assert_same_weights(
        _safetensors(gw.root / "eval-out" / "model.safetensors"),
        _safetensors(reference / "model.safetensors"),
    )
