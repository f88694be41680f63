"""The host's heaviest processes as text rows, in the GPU process table's columns."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.text import Text

from gpuwarden.core.units import size
from gpuwarden.tui.backend import HostTop, TopProcess
from gpuwarden.tui.formatting import cut

TITLE = "Heaviest processes (by CPU, and the largest in memory)"
# (label, width, right-aligned); the command takes what is left.
COLUMNS: tuple[tuple[str, int, bool], ...] = (
    ("PID", 7, False),
    ("User", 8, False),
    ("CPU%", 5, True),
    ("RSS", 8, True),
    ("Run", 11, False),
)


def pick(processes: Sequence[TopProcess], count: int) -> list[TopProcess]:
    """`count` rows of a busiest-first list: the busiest half, the rest the largest in memory
    (a leaking process idles), still busiest first."""
    busiest = list(processes[: -(-count // 2)])
    chosen = {p.pid for p in busiest}
    largest = [p for p in sorted(processes, key=lambda p: p.rss or 0, reverse=True) if p.pid not in chosen]
    keep = chosen | {p.pid for p in largest[: count - len(busiest)]}
    return [p for p in processes if p.pid in keep]


def top_lines(top: HostTop | None, runs: Mapping[str, str], width: int, rows: int) -> list[Text]:
    """A title, the columns' header and as many processes as `rows` leave; or the one line that
    says why there are none. `runs` names gpuwarden's runs by id."""
    if rows < 1:
        return []
    if top is None or top.unavailable:
        why = top.unavailable if top is not None else "host processes: not read yet"
        return [Text(cut(why or "", width), style="dim")]
    if rows < 3:
        return []
    lines = [Text(cut(TITLE, width), style="bold"), _header(width)]
    lines += [_row(p, runs, width) for p in pick(top.processes, rows - 2)]
    if not top.processes:
        lines.append(Text("no process could be read", style="dim"))
    return lines


def _command_width(width: int) -> int:
    return max(8, width - sum(w + 1 for _, w, _ in COLUMNS))


def _header(width: int) -> Text:
    cells = [label.rjust(w) if right else label.ljust(w) for label, w, right in COLUMNS]
    return Text(" ".join([*cells, "Command"]), style="bold dim", no_wrap=True)


def _row(p: TopProcess, runs: Mapping[str, str], width: int) -> Text:
    line = Text(no_wrap=True)
    line.append(f"{p.pid:<7} ")
    line.append(cut(p.user or "?", 8).ljust(8), style="bold" if p.owned else "")
    line.append(" " + ("–" if p.cpu_percent is None else f"{p.cpu_percent:.0f}").rjust(5))
    line.append(" " + size(p.rss).rjust(8) + " ")
    run = runs.get(p.run_id, p.run_id) if p.run_id else None
    line.append(cut(run or "–", 11).ljust(11), style="green" if run else "dim")
    command = f"{p.host}: {p.command}" if p.host else p.command
    line.append(" " + cut(command, _command_width(width)))
    return line
