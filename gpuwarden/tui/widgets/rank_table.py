"""The ranks of a multi-process run's latest attempt, one line each: the process, its GPU, its
last step and memory; the straggler (the rank the others wait for) and a rank's own failure
stand out. Hidden for a one-process run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.text import Text
from textual.widgets import Static

from gpuwarden.core.api import Attempt, RankStatus
from gpuwarden.core.units import size


def _where(rank: RankStatus, gpu_index: Mapping[str, int]) -> str:
    if rank.gpu is None:
        return "CPU"
    return f"GPU {gpu_index[rank.gpu]}" if rank.gpu in gpu_index else rank.gpu[:12]


def _memory(rank: RankStatus) -> str:
    if rank.gpu is None and rank.vm_peak is not None:
        return f"{size(rank.vm_peak)} addr"
    return f"{size(rank.mem_peak)} peak"


def ranks_text(ranks: Sequence[RankStatus], gpu_index: Mapping[str, int]) -> Text:
    """The lines the table shows (empty for a one-process attempt)."""
    text = Text()
    if not ranks:
        return text
    text.append(f"Ranks ({len(ranks)})\n", style="bold")
    for rank in ranks:
        step = "–" if rank.step is None else f"{rank.step:g}"
        text.append(f"  {rank.rank:>2}  ", style="bold")
        pid = rank.pid or "–"
        text.append(f"{_where(rank, gpu_index):<8} pid {pid:<8} step {step:>6}  {_memory(rank):>16}")
        if rank.failure:
            text.append(f"  {rank.failure}", style="bold red")
        if rank.straggler:
            text.append("  straggler", style="bold yellow")
            if rank.straggler_reason:
                text.append(f": {rank.straggler_reason}", style="yellow")
        text.append("\n")
    return text


class RankTable(Static):
    """`show(latest attempt, GPU UUID → index)` after each detail load."""

    DEFAULT_CSS = """
    RankTable { height: auto; padding: 0 1; }
    """

    def show(self, attempt: Attempt | None, gpu_index: Mapping[str, int]) -> None:
        ranks = attempt.ranks if attempt is not None else []
        self.display = bool(ranks)
        self.update(ranks_text(ranks, gpu_index))
