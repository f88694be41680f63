"""A program submitted with nothing naming its micro-batch — no preset knows it and its own flags
include one that looks like its batch size, or a framework preset found none: said at submit, so
the first out-of-memory is not where the user first learns a role can name it."""

from __future__ import annotations

import re

from gpuwarden.core.config.argv_flags import flag_setting, override_setting
from gpuwarden.core.config.spec import RunSpec

UNNAMED_CODE = "batch_unnamed"
# `--batch-size`, `--batch_size`, `--train-batch-size`, `--micro-batch`, `--bs`
_BATCH_NAME = re.compile(r"(^|_)(batch(_size)?|bs|micro_batch)$")


def unnamed_batch_warning(spec: RunSpec) -> str | None:
    """The line for a plain command whose flags carry a batch size no role names, or a preset run
    with no micro-batch; None otherwise."""
    command = spec.command
    if command is None or "micro_batch" in command.roles.knob_names():
        return None
    if command.framework != "none":
        where = (
            f"the command's flags or {command.config_file.name}"
            if command.config_file
            else "the command's flags"
        )
        return (
            f"the {command.framework} preset found no batch size in {where}, so an out-of-memory stops "
            "the run — name where it is set: --role micro_batch=FLAG or KEY (or command.roles in a spec)"
        )
    fix = role_fix(spec)
    if fix is None:
        return None
    return (
        f"nothing names the micro-batch, so an out-of-memory stops the run — "
        f"{fix}, or command.roles in a spec"
    )


def role_fix(spec: RunSpec) -> str | None:
    """How to name the flag of the command that reads as its batch size; None when none does."""
    command = spec.command
    flag = next(iter(_batch_flags(command.argv)), None) if command is not None else None
    if flag is None:
        return None
    return (
        f"if {flag} sets the micro-batch, add --role micro_batch={flag.lstrip('-')} (and --role "
        "accum_steps=… where the script accumulates gradients)"
    )


def _batch_flags(argv: list[str]) -> list[str]:
    """The flags of `argv`, as written, whose name reads as a batch size and whose value is a
    whole number."""
    found = []
    for i, item in enumerate(argv):
        override = override_setting(item) if i > 0 else None
        last = override[1].rpartition(".")[2] if override is not None else ""
        if override is not None and _BATCH_NAME.search(last) and override[2].isdigit():
            found.append(override[1])  # Hydra's `training.batch_size=64`: the role names the key
            continue
        parsed = flag_setting(item)
        if parsed is None or not _BATCH_NAME.search(parsed[0]):
            continue
        value = parsed[1] if parsed[1] is not None else (argv[i + 1] if i + 1 < len(argv) else "")
        if value.isdigit():
            found.append(item.partition("=")[0])
    return found
