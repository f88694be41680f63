"""What names a run: its id, its name, or a unique prefix of either.

One home for the shapes, so the spec that gives a run its name, the store that resolves a
reference and the client that refuses a hopeless one before sending agree.
"""

from __future__ import annotations

import os
import re

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
RUN_ID_RE = re.compile(r"^r[0-9a-f]{10}$")
# Longer than any name (64) or id: a reference this long names no run, and is not looked up.
MAX_REF_CHARS = 128


def new_run_id() -> str:
    """'r' + 10 random hex digits: short to type, and a prefix of it is usually unique."""
    return "r" + os.urandom(5).hex()
