"""A program's output in the run screen's Log tab, shown as its own terminal would show it."""

from __future__ import annotations

from textual.widgets import Log

from gpuwarden.core.terminal_line import TerminalLine
from gpuwarden.core.terminal_text import log_text


class ProgramLog(Log):
    """Textual's Log fed through a terminal's line discipline: a progress bar redrawn with
    carriage returns stays one line, updated in place, and escape sequences never reach the
    dashboard's own terminal (a program's screen clear would repaint the whole dashboard)."""

    def __init__(self, *, max_lines: int | None = None, id: str | None = None) -> None:
        super().__init__(max_lines=max_lines, auto_scroll=True, id=id)
        self._line = TerminalLine()

    def write_output(self, data: str) -> None:
        """Append what the program wrote (any chunk of it: a line may go on in the next)."""
        finished = self._line.feed(log_text(data))
        self._redraw_last("".join(line + "\n" for line in finished) + self._line.text)

    def write_notice(self, line: str) -> None:
        """`line` on a line of its own, after whatever the program left unfinished."""
        if self._line.text:
            self.write_output("\n")
        self._line = TerminalLine()
        self.write(line + "\n")

    def clear(self) -> ProgramLog:
        self._line = TerminalLine()
        super().clear()
        return self

    def _redraw_last(self, text: str) -> None:
        """Replace the unfinished last line with `text` (which may finish it and add more). Log
        has no call to rewrite a line, so its last line is emptied and written again."""
        if self._lines:
            self._lines[-1] = ""
            self.refresh_lines(len(self._lines) - 1)
        self.write(text)
