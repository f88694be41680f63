"""What an error message may show of a value or a key the user's file holds.

A file given as a spec or a config may be anything a link points at (`/etc/shadow`), and a bad
value may be a secret in the wrong key (`sample_interval: <a token>`). Messages name the key
and its line; of a value they show a short, cut excerpt, and a "key" that is not a key name
(a line of some other file that happens to parse as YAML) is not shown at all.
"""

from __future__ import annotations

import re
from typing import Any

from gpuwarden.core.terminal_text import plain_text

# Typos are worth echoing in full ("lots", "fp33", "-3GiB"); longer text shows its start only.
SHOWN_WHOLE = 12
SHOWN_START = 8
_KEY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


def value_excerpt(value: Any) -> str:
    """The value as the file wrote it (`true`, `null`, `'fp8'`), or its start when longer than a
    typo: `'TOPSECRE…' (18 characters)`; a list or mapping by its size only."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, dict):
        return f"a mapping of {len(value)} key{'s' if len(value) != 1 else ''}"
    text = plain_text(value) if isinstance(value, str) else str(value)
    if len(text) <= SHOWN_WHOLE:
        return repr(text) if isinstance(value, str) else text
    start = f"'{text[:SHOWN_START]}…'" if isinstance(value, str) else f"{text[:SHOWN_START]}…"
    return f"{start} ({len(text)} characters)"


def is_key_name(key: object) -> bool:
    """Whether `key` reads as a key someone meant to write (shown in messages), not a line of
    another kind of file."""
    return isinstance(key, str) and _KEY_NAME.fullmatch(key) is not None
