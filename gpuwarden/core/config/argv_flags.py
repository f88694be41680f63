"""The settings a program's own flags carry, as gpuwarden names them: `--batch-size 64`,
`--batch_size=64` and `--batch-size=64` are the setting `batch_size` (dotted names, such as
LightningCLI's `--data.batch_size`, are kept exactly). An override written as Hydra and OmegaConf
take them, `training.batch_size=64` (also `+key=…`, `++key=…`), is the setting `training.batch_size`.
A role may name one, and its value becomes the knob the role changes."""

from __future__ import annotations

import re

# `{name}`, `{name?}` or `{name=default}`: a knob already in place.
OWN_KNOB_RE = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*(\?|=[^{}]*)?\}")
# `training.batch_size=64`, `+trainer.max_steps=10`, `++x=1`: the prefix, the key, the value.
_OVERRIDE_RE = re.compile(r"(\+{0,2})([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)=(.*)", re.S)


def setting_name(text: str) -> str:
    """A flag or a name as the user wrote it (`--batch-size`, `batch-size`) → `batch_size`."""
    name = text.lstrip("-")
    return name if "." in name else name.replace("-", "_")


def flag_setting(item: str) -> tuple[str, str | None] | None:
    """`--per_device_train_batch_size=8` → ("per_device_train_batch_size", "8"); `--x` → ("x", None);
    None for what is no flag, or a flag whose value is a knob already."""
    if not item.startswith("--") or OWN_KNOB_RE.search(item):
        return None
    name, sep, value = item[2:].partition("=")
    return setting_name(name), (value if sep else None)


def override_setting(item: str) -> tuple[str, str, str] | None:
    """`training.batch_size=64` → ("", "training.batch_size", "64"); `++x=1` → ("++", "x", "1");
    None for anything else, or an override whose value is a knob already."""
    match = _OVERRIDE_RE.fullmatch(item)
    if match is None or OWN_KNOB_RE.search(item):
        return None
    return match.group(1), match.group(2), match.group(3)


def knob_for(setting: str, taken: set[str]) -> str:
    """The knob a setting becomes: its name, or for a dotted one its last part (`data.batch_size`
    → `batch_size`), the whole with underscores where that one is taken."""
    if "." not in setting:
        return setting
    last = setting.rpartition(".")[2]
    return last if last not in taken else setting.replace(".", "_")


def valued_flags(argv: list[str]) -> set[str]:
    """The settings of `argv`'s flags that carry a value (`--x 8` or `--x=8`) and of its overrides
    (`x.y=8`), not a knob's."""
    found = set()
    for i, item in enumerate(argv):
        parsed = flag_setting(item)
        if parsed is None:
            continue
        name, inline = parsed
        following = argv[i + 1] if i + 1 < len(argv) else "--"
        if inline is not None or not (following.startswith("--") or OWN_KNOB_RE.fullmatch(following)):
            found.add(name)
    return found | {o[1] for o in map(override_setting, argv[1:]) if o is not None}
