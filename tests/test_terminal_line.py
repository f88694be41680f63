"""A line rewritten with carriage returns reads as the terminal showed it."""

from __future__ import annotations

from gpuwarden.core.terminal_line import TerminalLine


def test_each_redraw_replaces_the_line_and_a_newline_finishes_it() -> None:
    line = TerminalLine()
    assert line.feed("loading\n 10%|█ | 1/10\r 20%|██ | 2/10\r") == ["loading"]
    assert line.text == " 20%|██ | 2/10"
    assert line.feed(" 30%|███ | 3/10\n{'loss': 1.5}\n") == [" 30%|███ | 3/10", "{'loss': 1.5}"]
    assert line.text == ""


def test_a_shorter_redraw_leaves_the_tail_a_terminal_leaves() -> None:
    line = TerminalLine()
    line.feed("epoch 1: 100 items\rep 2")
    assert line.text == "ep 2h 1: 100 items"


def test_chunks_may_split_a_redraw_and_a_crlf_anywhere() -> None:
    whole, split = TerminalLine(), TerminalLine()
    data = "a 1/3\ra 2/3\r\na 3/3\rdone\r\nnext"
    finished = whole.feed(data)
    pieces = [split.feed(data[i : i + 3]) for i in range(0, len(data), 3)]
    assert [line for part in pieces for line in part] == finished == ["a 2/3", "done3"]
    assert split.text == whole.text == "next"
