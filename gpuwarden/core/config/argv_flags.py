"""The settings a program's own flags carry, as gpuwarden names them: `--batch-size 64`,
`--batch_size=64` and `--batch-size=64` are the setting `batch_size` (dotted names, such as
LightningCLI's `--data.batch_size`, are kept exactly). A role may name one, and the flag's value
becomes the knob the role changes."""

from __future__ import annotations

import re

# `{name}`, `{name?}` or `{name=default}`: a knob already in place.
OWN_KNOB_RE = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*(\?|=[^{}]*)?\}")


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


def valued_flags(argv: list[str]) -> set[str]:
    """The settings of `argv`'s flags that carry a value (`--x 8` or `--x=8`), not a knob's."""
    found = set()
    for i, item in enumerate(argv):
        parsed = flag_setting(item)
        if parsed is None:
            continue
        name, inline = parsed
        following = argv[i + 1] if i + 1 < len(argv) else "--"
        if inline is not None or not (following.startswith("--") or OWN_KNOB_RE.fullmatch(following)):
            found.add(name)
    return found
