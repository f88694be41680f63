"""A framework's own batch-size finder switched on under gpuwarden: said at submit.

The Trainer's `auto_find_batch_size` catches the out-of-memory itself and starts its loop again
at nine tenths of the batch, with the same accumulation: the effective batch shrinks, the
progress since the last checkpoint is lost in-process, and gpuwarden never sees a failure to
recover (measured: 16 ended at 12, the weights 4.6 % from an uninterrupted run's, where
gpuwarden kept 16 at 8 × 2). The two cannot both act; the user chooses.
"""

from __future__ import annotations

from gpuwarden.core.command.config_file import load_config
from gpuwarden.core.config.argv_flags import flag_setting
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError

FINDER_CODE = "batch_finder"
SETTING = "auto_find_batch_size"
_FALSE = {"false", "0", "no", "off", ""}


def batch_finder_warning(spec: RunSpec) -> str | None:
    """The line for a command that turns the Trainer's batch-size finder on, by flag or in its
    config file; None otherwise."""
    command = spec.command
    if command is None:
        return None
    where = _in_argv(command.argv)
    if where is None and command.config_file is not None and _in_file(spec):
        where = f"{SETTING}: true in {command.config_file.name}"
    if where is None:
        return None
    return (
        f"{where} lets the Trainer lower the batch itself when memory runs out, keeping the "
        "accumulation: the effective batch shrinks and gpuwarden sees no failure to recover — "
        "leave it out to have gpuwarden keep the effective batch and restart from the checkpoint"
    )


def _in_argv(argv: list[str]) -> str | None:
    for i, item in enumerate(argv[1:], start=1):
        parsed = flag_setting(item)
        if parsed is None or parsed[0] != SETTING:
            continue
        value = parsed[1]
        if value is None and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            value = argv[i + 1]  # `--auto_find_batch_size True`, as HfArgumentParser takes it
        if value is None or value.strip().lower() not in _FALSE:
            return item.partition("=")[0]
    return None


def _in_file(spec: RunSpec) -> bool:
    assert spec.command is not None and spec.command.config_file is not None
    try:
        value = load_config(spec.command.config_file).get(SETTING)
    except (KeyError, UserError):
        return False  # not there, or a file the spec's own checks refuse in their words
    return value is True or (isinstance(value, str) and value.strip().lower() not in _FALSE)
