"""Real CUDA out-of-memory, recovered through the daemon, on a ~0.5 B-parameter causal LM built
locally from a config with random weights, on a 12 GB card emulated on a bigger one (memcap/).

- training: micro-batch 16 does not fit in 12 GB; the recovered run keeps the effective batch and
  ends with the weights of an uninterrupted run at micro-batch 16 on the full card, up to what
  another micro-batch split changes by itself (measured: an uninterrupted run at the recovered
  split, on the full card);
- generation: a batch whose KV cache does not fit; every prompt is answered exactly once;
- fragmentation: a program that leaves its cached memory in pieces; the allocator rung
  (`expandable_segments`) alone makes it fit.

Each takes minutes: `make gpu-check` runs them as separate steps. Skipped without CUDA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import DaemonHandle
from tests.gpu.conftest import capped_env, require_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

# LlamaForCausalLM, hidden 1280 × 24 layers, vocabulary 32 000, untied embeddings: 0.47 B parameters.
LLM = {"hidden": 1280, "layers": 24, "vocab": 32000}
CAP_GIB = 12
FRAGMENT = Path(__file__).resolve().parent / "fragment.py"


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_cuda()
    from gpuwarden.runners.testing_models import build_tiny_causal_lm

    return build_tiny_causal_lm(tmp_path_factory.mktemp("llm") / "llm", max_positions=2048, **LLM)


def _weights(model_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(str(path)))
    assert out, f"no weights in {model_dir}"
    return out


def _train_spec(name: str, llm: Path, data: Path, batch: int, env: dict[str, str]) -> str:
    return f"""
        name: {name}
        kind: train
        env: {json.dumps(env)}
        resources: {{gpus: 1}}
        train:
          task: causal_lm
          model: {llm}
          data: {data}
          max_length: 512
          packing: true
          batch_size: {batch}
          grad_accum_steps: {16 // batch}
          max_steps: 3
          precision: fp32
          tf32: false
          cudnn_benchmark: false
          optimizer: {{lr: 1.0e-5, weight_decay: 0.0}}
          scheduler: {{schedule: constant}}
          grad_clip: null
          log_interval: 1
          checkpoint_interval: 1000
          num_workers: 0
          seed: 0
        """


def _uninterrupted(root: Path, llm: Path, data: Path, batch: int) -> dict[str, Any]:
    """Final weights of the training spec run by the runner alone on the whole card."""
    spec = root.with_suffix(".yaml")
    spec.write_text(
        _train_spec(root.name, llm, data, batch, {"PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    )
    done = subprocess.run(
        [sys.executable, "-m", "gpuwarden.runners", "--spec", str(spec), "--run-dir", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return _weights(root / "outputs" / "model")


def test_llm_training_oom_keeps_the_effective_batch_and_reaches_the_full_card_weights(
    daemon_factory: Any, llm: Path, tmp_path: Path, record_property: Any
) -> None:
    torch = require_cuda()
    from gpuwarden.runners.testing_models import write_text_dataset

    data = write_text_dataset(tmp_path / "texts.jsonl", 3000, seed=1)
    gw: DaemonHandle = daemon_factory({"GPUWARDEN_FAKE_NVML": ""})
    spec = gw.write_spec("llm-train", _train_spec("llm-train", llm, data, 16, capped_env(CAP_GIB)))
    result = gw.cli("run", str(spec), "--follow", timeout=420)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    detail = gw.cli_json("show", "llm-train")
    assert detail["state"] == "succeeded" and detail["effective_batch"] == 16
    retunes = detail["retunes"]
    assert retunes and retunes[0]["verdict"] == "gpu_capacity" and retunes[-1]["outcome"] == "succeeded"
    assert len(retunes) <= 2
    to = retunes[-1]["to"]
    micro, accum = to["train.batch_size"], to["train.grad_accum_steps"]
    assert micro < 16 and micro * accum == 16
    record_property("recovered at", f"{micro} × {accum} after {len(retunes)} retune(s)")

    # The same run, uninterrupted on the whole card: at micro-batch 16, and at the recovered split.
    start = _weights(llm)
    ref = _uninterrupted(tmp_path / "reference", llm, data, 16)
    split = _uninterrupted(tmp_path / "same-split", llm, data, micro)
    got = _weights(Path(detail["run_dir"]) / "outputs" / "model")
    assert got.keys() == ref.keys() == split.keys()
    # AdamW normalises each gradient element, so the rounding of another micro-batch split can
    # flip the update of elements whose gradient is near zero (on an H100 the run recovered at
    # 2 × 8 ended 5.9 % of one tensor's update away from the micro-batch-16 run). The recovery
    # may cost no more than twice what the split costs by itself, tensor by tensor (twice: CUDA's
    # atomic adds make two identical runs differ too), and 5 % where the split costs nothing.
    rows = []  # (off, the split alone, name)
    for name, tensor in ref.items():
        update = (tensor.float() - start[name].float()).norm().item()
        if update:
            off = (got[name].float() - tensor.float()).norm().item() / update
            rows.append((off, (split[name].float() - tensor.float()).norm().item() / update, name))
    worst = max(rows)
    record_property(
        "worst tensor: |recovered − uninterrupted| / |update|",
        f"{worst[0]:.2e} ({worst[2]}); the split alone: {worst[1]:.2e}",
    )
    beyond = [row for row in rows if row[0] > max(0.05, 2 * row[1])]
    assert not beyond, beyond[:5]
    torch.cuda.empty_cache()


def test_llm_generation_oom_loses_and_repeats_no_item(
    daemon_factory: Any, llm: Path, tmp_path: Path, record_property: Any
) -> None:
    require_cuda()
    from gpuwarden.runners.infer.example_models import write_prompts

    prompts = write_prompts(tmp_path / "long.jsonl", 96, seed=3, min_words=700, max_words=900)
    out = tmp_path / "generations.jsonl"
    gw: DaemonHandle = daemon_factory({"GPUWARDEN_FAKE_NVML": ""})
    # 96 prompts of ~1 000 tokens + 32 new: ~12 GB of KV cache in bf16 — more than the cap.
    spec = gw.write_spec(
        "llm-generate",
        f"""
        name: llm-generate
        kind: infer
        env: {json.dumps(capped_env(CAP_GIB))}
        resources: {{gpus: 1}}
        infer:
          task: generate
          model: {llm}
          input: {prompts}
          output: {out}
          batch_size: 96
          max_new_tokens: 32
          max_input_length: 1024
        """,
    )
    result = gw.cli("run", str(spec), "--follow", timeout=420)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    detail = gw.cli_json("show", "llm-generate")
    assert detail["state"] == "succeeded"
    retunes = detail["retunes"]
    assert retunes and retunes[0]["verdict"] == "gpu_capacity"
    record_property("retunes", " → ".join(str(r["to"]) for r in retunes))
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    expected = [json.loads(line).get("id", i) for i, line in enumerate(prompts.read_text().splitlines())]
    assert sorted(map(str, ids)) == sorted(map(str, expected))  # every item exactly once
    assert len(ids) == len(set(ids)) == 96


def test_a_fragmenting_workload_is_recovered_by_expandable_segments(
    daemon_factory: Any, record_property: Any
) -> None:
    require_cuda()
    gw: DaemonHandle = daemon_factory({"GPUWARDEN_FAKE_NVML": ""})
    spec = {
        "name": "fragments",
        "kind": "command",
        "command": {"argv": [sys.executable, str(FRAGMENT)]},
        "env": capped_env(CAP_GIB),
        "resources": {"gpus": 1},
    }
    run = gw.submit(spec)
    final = gw.wait_state(run["id"], timeout=300)
    detail = gw.cli_json("show", run["id"])
    record_property("verdicts", ", ".join(r["verdict"] for r in detail["retunes"]))
    assert final["state"] == "succeeded", final["message"]
    (retune,) = detail["retunes"]
    assert retune["verdict"] == "gpu_fragmentation"
    assert "expandable_segments:True" in json.dumps(retune["to"])
    logs = gw.cli("logs", run["id"]).stdout
    assert "fits: the large block was allocated" in logs
