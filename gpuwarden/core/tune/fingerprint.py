"""What a tuning result depends on, hashed: the model, the shapes, the device, the libraries.

The next run with the same fingerprint starts from the remembered result instead of probing
again. Anything that changes memory or speed belongs in it; nothing else does (the data path,
the run's name and its step count do not).
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.tune.fingerprint_command import command_fingerprint_inputs

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def _model_identity(model_dir: Path | None) -> dict[str, Any] | None:
    """config.json's content hash plus the weight files' sizes: cheap, and changes with the model."""
    if model_dir is None:
        return None
    out: dict[str, Any] = {"dir": model_dir.name}
    config = model_dir / "config.json"
    if config.is_file():
        out["config_sha256"] = hashlib.sha256(config.read_bytes()).hexdigest()
    if model_dir.is_dir():
        out["weights_bytes"] = sum(
            p.stat().st_size for p in model_dir.iterdir() if p.suffix in _WEIGHT_SUFFIXES and p.is_file()
        )
    return out


def library_versions() -> dict[str, str | None]:
    """Installed versions, read from package metadata (importing torch here would defeat the
    daemon's no-torch rule)."""
    out: dict[str, str | None] = {}
    for name in ("torch", "transformers", "accelerate"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def fingerprint_inputs(
    spec: RunSpec, device: dict[str, Any], objective: str = "throughput", power_sweep: bool = False
) -> dict[str, Any]:
    """The JSON-able facts the fingerprint hashes; kept next to the result for humans. The
    objective and the sweep change the answer, so they count — except the defaults, so results
    remembered before there were objectives keep their fingerprint."""
    inputs: dict[str, Any] = {"kind": spec.kind, "device": device, "libraries": library_versions()}
    if objective != "throughput":
        inputs["objective"] = objective
    if power_sweep:
        inputs["power_sweep"] = True
    if spec.train is not None:
        t = spec.train
        inputs.update(
            task=t.task,
            model=_model_identity(t.model) if t.task == "causal_lm" else t.image.model_dump(mode="json"),
            shapes={"max_length": t.max_length, "packing": t.packing} if t.task == "causal_lm" else {},
            gradient_checkpointing=t.gradient_checkpointing,
            channels_last=t.channels_last,
            effective_batch=t.effective_batch,
        )
    elif spec.infer is not None:
        i = spec.infer
        inputs.update(
            task=i.task,
            model=_model_identity(i.model),
            shapes={
                "max_new_tokens": i.max_new_tokens,
                "max_input_length": i.max_input_length,
                "max_pixels": i.max_pixels,
            },
            kv_cache=i.kv_cache,
            attn_implementation=i.attn_implementation,
        )
    elif spec.command is not None:
        inputs["command"] = command_fingerprint_inputs(spec)
    return inputs


def fingerprint(inputs: dict[str, Any]) -> str:
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]
