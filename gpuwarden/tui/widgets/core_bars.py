"""Each CPU core's share as text: a labelled bar per core where the rows allow, else one block
character per core (a 128-core host still fits two lines)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from gpuwarden.tui.formatting import bar

BAR_WIDTHS = (10, 6, 3)  # a core's bar, widest first: narrower ones when the rows are few
GAP = 2  # cells between two cores on a line
BLOCKS = " ▁▂▃▄▅▆▇█"
BLOCKS_LABEL = "cores "
MORE = " +9999"  # room kept for the count of the cores left out


def load_style(percent: float) -> str:
    """Calm while there is room, warm near saturation (a data loader starving a GPU)."""
    if percent >= 95:
        return "red"
    return "yellow" if percent >= 80 else "cyan"


def core_lines(cores: Sequence[float], width: int, rows: int) -> list[Text]:
    """`cores` (percent each) in at most `rows` lines of `width` cells."""
    if not cores or rows < 1:
        return []
    label = len(str(len(cores) - 1))
    for bar_width in BAR_WIDTHS:
        cell = label + 1 + bar_width + len(" 100%")
        per_line = max(1, (width + GAP) // (cell + GAP))
        if -(-len(cores) // per_line) <= rows:
            return _cells(cores, label, bar_width, per_line)
    return _blocks(cores, width, rows)


def _cells(cores: Sequence[float], label: int, bar_width: int, per_line: int) -> list[Text]:
    lines: list[Text] = []
    for start in range(0, len(cores), per_line):
        line = Text(no_wrap=True)
        for i in range(start, min(start + per_line, len(cores))):
            if i > start:
                line.append(" " * GAP)
            line.append(f"{i:>{label}} ", style="dim")
            line.append(bar(cores[i] / 100, bar_width), style=load_style(cores[i]))
            line.append(f" {cores[i]:>3.0f}%")
        lines.append(line)
    return lines


def _blocks(cores: Sequence[float], width: int, rows: int) -> list[Text]:
    """One character per core, its height the core's share; cores past `rows` lines are left out
    and counted (`+N`) at the end of the last."""
    per_line = max(1, width - len(BLOCKS_LABEL))
    lines: list[Text] = []
    start = 0
    while start < len(cores) and len(lines) < rows:
        last = len(lines) == rows - 1 and len(cores) - start > per_line
        chunk = cores[start : start + per_line - (len(MORE) if last else 0)]
        line = Text(" " * len(BLOCKS_LABEL) if lines else BLOCKS_LABEL, style="dim", no_wrap=True)
        for c in chunk:
            line.append(BLOCKS[round(max(0.0, min(100.0, c)) / 100 * 8)], style=f"{load_style(c)} on grey15")
        start += len(chunk)
        if last:
            line.append(f" +{len(cores) - start}", style="dim")
        lines.append(line)
    return lines
