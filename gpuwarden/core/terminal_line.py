"""The line a terminal shows while a program rewrites it in place.

Progress bars (tqdm's, the Trainer's, Lightning's) redraw one line hundreds of times: a carriage
return moves the cursor back to the line's start and what follows overwrites what was there. A
log view that made each redraw a line of its own would bury the program's messages under a
thousand bars; one that keeps the last drawing shows what the program's own terminal showed,
as `docker logs` or `kubectl logs` read in a terminal do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PIECES = re.compile(r"[^\r\n]+|\r|\n")


@dataclass
class TerminalLine:
    """The unfinished last line of some output and the cursor's column in it."""

    text: str = ""
    column: int = 0

    def feed(self, data: str) -> list[str]:
        """Apply `data` (escape sequences already removed) as a terminal would; return the lines
        it finished, in order. `text` is then the line still being written."""
        finished: list[str] = []
        for piece in _PIECES.findall(data):
            if piece == "\n":
                finished.append(self.text)
                self.text, self.column = "", 0
            elif piece == "\r":
                self.column = 0
            else:
                end = self.column + len(piece)
                self.text = self.text[: self.column] + piece + self.text[end:]
                self.column = end
        return finished
