"""Whether an out-of-memory happened in evaluation, read from the program's traceback.

The Trainer evaluates with its own batch (`per_device_eval_batch_size`), as do most hand-written
loops (`eval_batch_size`): a smaller training micro-batch does not shrink what evaluation holds,
so a retune that lowers it restarts into the same failure. The frames of the traceback that
ended the attempt say where it was: the Trainer's `evaluation_loop`, Lightning's
`validation_step` and `_evaluation_step`, a script's own `evaluate` or `validate`.
"""

from __future__ import annotations

import re

_TRACEBACK = "Traceback (most recent call last):"
# What Python writes between the tracebacks of one chain of exceptions.
_CHAINED = ("During handling of the above exception, another exception occurred:",
            "The above exception was the direct cause of the following exception:")  # fmt: skip
_FRAME = re.compile(r'^\s*File "[^"\n]*", line \d+, in ([\w.<>]+)', re.MULTILINE)
# `validate_*` and `_validate*` are left out: that is how argument checks are named.
_EVALUATION = re.compile(
    r"^_*(?:eval(?:uate|uation)?(?:_\w+)?|validate|validation(?:_\w+)?|val_(?:step|loop|epoch))$",
    re.IGNORECASE,
)


def _last_chain(text: str) -> str:
    """The last traceback of `text` with the ones chained before it."""
    start = text.rfind(_TRACEBACK)
    if start < 0:
        return ""
    while True:
        before = text[max(0, start - 200) : start].rstrip()  # a window: hostile text may chain many
        if not before.endswith(_CHAINED):
            return text[start:]
        earlier = text.rfind(_TRACEBACK, 0, start)
        if earlier < 0:
            return text[start:]
        start = earlier


def evaluation_frame(text: str) -> str | None:
    """The innermost function of the failing traceback that evaluates (the Trainer's
    `evaluation_loop` rather than the `evaluate` that called it), if any."""
    found = [name for name in _FRAME.findall(_last_chain(text)) if _EVALUATION.match(name)]
    return found[-1] if found else None
