"""What a program wrote for a terminal, made fit to show as one line of plain text.

A failed program's last stderr line, or an error message a user's script wrote, ends up in
`gpuwarden ps`, the API and the daemon's log. Colour codes, cursor moves, a terminal title
(OSC) or a bell there would repaint or retitle the terminal of whoever reads them.
"""

from __future__ import annotations

import re
import unicodedata

# ECMA-48 escape sequences: CSI (colours, cursor moves), OSC up to its terminator (titles,
# hyperlinks), any other two-character escape, and the one-byte CSI.
ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[@-_]?"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)


def plain_text(text: str) -> str:
    """`text` without escape sequences and with every other control or format character (line
    breaks, carriage returns, tabs, bidirectional overrides) as a space, runs of them as one."""
    text = ESCAPES.sub("", text)
    text = "".join(" " if unicodedata.category(ch).startswith("C") else ch for ch in text)
    return re.sub(" {2,}", " ", text).strip()


def log_text(text: str) -> str:
    """`text` with its lines, tabs and carriage returns kept, for a log view: escape sequences
    and every other control character removed (a log view redraws a line that a carriage return
    rewrites, as a terminal would: `terminal_line.TerminalLine`). Format characters stay: emoji
    sequences and other scripts need them."""
    text = ESCAPES.sub("", text).replace("\r\n", "\n")
    return "".join(ch for ch in text if ch in "\n\t\r" or unicodedata.category(ch) != "Cc")
