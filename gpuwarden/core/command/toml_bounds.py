"""A TOML text's nesting and number of values, bounded before any TOML parser reads it.

tomllib has no limits of its own: its inline arrays recurse once per `[` (a RecursionError a
thousand levels down), its dotted keys cost time quadratic in their length (200 KB of
`[t.t.t…]` took 6.6 s) and every value becomes an object. This scan blanks out strings and
comments, then counts what is left with the regex engine, so a hostile file is refused in
milliseconds. The counts are upper bounds (a trailing comma counts as a value, a header's
brackets as a level); what passes is then parsed and counted exactly.
"""

from __future__ import annotations

import re

from gpuwarden.core.errors import UserError
from gpuwarden.core.safeload import ReadLimits

_STRING_OR_COMMENT = re.compile(
    r'"""(?:[^\\]|\\.)*?"""'  # multi-line basic string
    r"|'''.*?'''"  # multi-line literal string
    r'|"(?:[^"\\\n]|\\.)*"'  # basic string
    r"|'[^'\n]*'"  # literal string
    r"|#[^\n]*",  # comment
    re.S,
)
_BRACKET = re.compile(r"[\[\]{}]")
# A key before `=`, or a table header; array rows of numbers (`[1.5, 2.5]`) hold commas and are
# left out so their decimal points do not count as levels.
_KEY_OR_HEADER = re.compile(r"^[ \t]*(?:\[\[?([^\[\],=\n]*)\]\]?[ \t]*$|([^=\n\[\]{},]*)=)", re.M)


def check_toml_bounds(text: str, label: str, limits: ReadLimits) -> None:
    """Refuse TOML whose values or nesting (brackets, or the parts of a dotted key) exceed
    `limits`, with one line; say nothing about its syntax (the parser does that)."""
    plain = _STRING_OR_COMMENT.sub("0", text)
    if _bracket_depth(plain) > limits.max_depth or _key_depth(plain) > limits.max_depth:
        raise UserError(f"{label}: nested deeper than {limits.max_depth} levels — flatten it")
    if sum(plain.count(c) for c in "=,[{") > limits.max_values:
        raise UserError(
            f"{label}: more than {limits.max_values} values, the limit for one document — "
            "a config holds hundreds"
        )


def _bracket_depth(plain: str) -> int:
    depth = deepest = 0
    for match in _BRACKET.finditer(plain):
        depth = depth + 1 if match[0] in "[{" else max(depth - 1, 0)
        deepest = max(deepest, depth)
    return deepest


def _key_depth(plain: str) -> int:
    return max((1 + (m[1] or m[2] or "").count(".") for m in _KEY_OR_HEADER.finditer(plain)), default=0)
