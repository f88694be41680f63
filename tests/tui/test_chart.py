"""The Line-API chart, rendered line by line with no app running."""

from __future__ import annotations

from rich.style import Style

from gpuwarden.tui.widgets.chart import Chart, braille_row, column_levels, resample

FULL = "\u28ff"  # all eight dots
LEFT_BOTTOM = "\u2840"  # dot 7 only: bottom-left
RIGHT_BOTTOM = "\u2880"  # dot 8 only: bottom-right
RIGHT_FULL = "\u28b8"  # dots 4, 5, 6, 8: the right column


def lines(chart: Chart) -> list[str]:
    return [chart.render_line(y).text for y in range(chart.plot_height)]


def test_levels_keep_zero_visible_and_missing_blank() -> None:
    assert column_levels([0.0, None, 50.0, 100.0, 250.0], height=2, vmin=0.0, vmax=100.0) == [1, -1, 4, 8, 8]


def test_braille_row_packs_two_samples_per_cell() -> None:
    assert braille_row([4, 4], 0) == FULL
    assert braille_row([1, 0], 0) == LEFT_BOTTOM
    assert braille_row([0, 1], 0) == RIGHT_BOTTOM
    assert braille_row([-1, -1], 0) == " "
    # Level 6 on two rows: the bottom row is full, the top row has its two lowest dot rows.
    assert braille_row([6, 6], 0) == FULL
    assert braille_row([6, 6], 1) == "\u28e4"  # dots 3, 6, 7, 8


def test_newest_values_sit_at_the_right_edge() -> None:
    chart = Chart(capacity=100, width=4, height=1, vmax=100.0)
    chart.extend([100.0, 100.0])
    assert lines(chart) == ["   " + FULL]
    chart.push(None)
    chart.push(100.0)
    assert lines(chart) == ["  " + FULL + RIGHT_FULL]  # a missing sample leaves its half empty


def test_capacity_bounds_memory_and_only_visible_samples_are_drawn() -> None:
    chart = Chart(capacity=10, width=2, height=1, vmax=1.0)
    chart.extend([1.0] * 8 + [0.0] * 4)
    assert len(chart.values) == 10
    # 2 cells show the last 4 samples, all zero: the one-dot baseline in each column.
    assert lines(chart) == ["\u28c0\u28c0"]


def test_auto_scale_uses_the_largest_visible_value() -> None:
    chart = Chart(width=1, height=1)  # vmax None: scale to the data
    chart.extend([2.0, 4.0])
    assert lines(chart) == ["\u28fc"]  # left: 2 of 4 dots (half the maximum), right: full


def test_cursor_cell_is_reversed_and_moves_with_the_index() -> None:
    chart = Chart(width=3, height=1, vmax=1.0, style="green")
    chart.extend([1.0] * 6)
    chart.set_cursor(2)  # sample 2 lives in cell 1
    segments = list(chart.render_line(0))
    assert [s.text for s in segments] == [FULL, FULL, FULL]
    assert segments[1].style == Style.parse("green") + Style(reverse=True)
    assert segments[0].style == Style.parse("green")
    chart.set_cursor(99)  # clamped to the last sample
    assert chart.cursor == 5


def test_redraw_cache_is_invalidated_by_new_data() -> None:
    chart = Chart(width=1, height=1, vmax=1.0)
    chart.push(1.0)
    first = lines(chart)
    chart.push(1.0)
    assert lines(chart) != first


def test_fit_stretches_a_short_series_and_squeezes_keeping_peaks() -> None:
    assert resample([1.0, 2.0], 4) == [1.0, 1.0, 2.0, 2.0]
    assert resample([0.0, 9.0, 0.0, 0.0, 1.0, 0.0], 3) == [9.0, 0.0, 1.0]
    assert resample([None, None], 1) == [None]
    chart = Chart(width=2, height=1, vmax=1.0, fit=True)
    chart.extend([1.0, 1.0])
    assert lines(chart) == [FULL + FULL]


def test_blank_when_out_of_range_or_empty() -> None:
    chart = Chart(width=3, height=2)
    assert lines(chart) == ["   ", "   "]
    assert chart.render_line(5).text == "   "


def test_axes_show_the_range_the_labels_and_the_limit_line() -> None:
    chart = Chart(width=14, height=4, vmax=100.0, y_gutter=5, axis=True)
    chart.extend([10.0] * 18)
    chart.set_axes(("100%", "0"), [(0.0, "-5m"), (1.0, "now")], limit=80.0)
    top, middle, bottom, axis = (chart.render_line(y).text for y in range(4))
    assert top.startswith("100%┤") and middle.startswith("    │") and bottom.startswith("   0┤")
    assert axis == "     -5m   now"
    # 80 of 100 on three plot rows is dot 10 of 12: the top row's second dot row, over empty cells.
    assert top[5:] == "\u2824" * 9
    segments = list(chart.render_line(0))
    assert segments[-1].style == Style.parse("red")


def test_series_flat_at_the_top_is_drawn_as_a_line_not_a_block() -> None:
    chart = Chart(capacity=100, width=3, height=3, vmax=100.0)
    chart.extend([100.0] * 6)
    top_dots = "\u2809"  # dots 1 and 4: the top dot row of both columns
    assert lines(chart) == [top_dots * 3, "   ", "   "]


def test_series_that_leaves_the_top_is_filled() -> None:
    chart = Chart(capacity=100, width=1, height=2, vmax=100.0)
    chart.extend([100.0, 50.0])
    assert lines(chart) == ["\u2847", FULL]  # left column full height, right half
