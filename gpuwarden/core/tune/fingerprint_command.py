"""What a tuning result of a user's own program depends on: the program, its files, its shapes.

The command line as written (flags such as `--max_length 1024` are shapes), the knobs except
the ones a tune sets or a probe redirects, the config file's text, the environment, and the
identity of every file or model folder the command line names: a script's content, a model's
config.json and weight sizes. A large data file counts by its size only (reading gigabytes to
fingerprint would cost more than the probes saved).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from gpuwarden.core.command.config_file import read_config_text
from gpuwarden.core.config.spec import RunSpec

_HASHED_UP_TO = 4 << 20
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
# Roles whose knobs a tune sets (micro-batch, accumulation) or a probe redirects: not identity.
_TUNED_ROLES = ("micro_batch", "accum_steps", "max_steps", "output_dir")


def _file_identity(path: Path) -> dict[str, Any]:
    size = path.stat().st_size
    if size > _HASHED_UP_TO:
        return {"size": size}
    return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def _dir_identity(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    config = path / "config.json"
    if config.is_file():
        out["config_sha256"] = hashlib.sha256(config.read_bytes()).hexdigest()
    out["weights_bytes"] = sum(
        p.stat().st_size for p in path.iterdir() if p.suffix in _WEIGHT_SUFFIXES and p.is_file()
    )
    return out


def _named_paths(spec: RunSpec) -> dict[str, dict[str, Any]]:
    """Identity of each existing file or folder that argv or a knob names (relative to cwd)."""
    assert spec.command is not None
    base = spec.command.cwd or Path.cwd()
    texts = [*spec.command.argv, *(str(v) for v in spec.knobs.values())]
    out: dict[str, dict[str, Any]] = {}
    for text in texts:
        if "{" in text or not text or text.startswith("-") or len(text) > 4096:
            continue
        path = Path(text) if Path(text).is_absolute() else base / text
        try:
            if path.is_file():
                out[text] = _file_identity(path)
            elif path.is_dir():
                out[text] = _dir_identity(path)
        except OSError:
            continue
    return out


def command_fingerprint_inputs(spec: RunSpec) -> dict[str, Any]:
    """The JSON-able facts of a command run that a tuning result depends on."""
    command = spec.command
    assert command is not None
    roles = command.roles.knob_names()
    skipped = {roles[r] for r in _TUNED_ROLES if r in roles}
    micro = spec.knobs.get(roles.get("micro_batch", ""), 1)
    accum = spec.knobs.get(roles.get("accum_steps", ""), 1)
    config_text = None
    if command.config_file is not None:
        config_text = hashlib.sha256(read_config_text(command.config_file).encode()).hexdigest()
    return {
        "framework": command.framework,
        "argv": command.argv,
        "knobs": {k: v for k, v in sorted(spec.knobs.items()) if k not in skipped},
        "env": {**command.env, **spec.env},
        "config_sha256": config_text,
        "files": _named_paths(spec),
        "per_device_batch": micro * accum if isinstance(micro, int) and isinstance(accum, int) else None,
    }


__all__ = ["command_fingerprint_inputs"]
