"""Reading how far a program has come from the bar it draws: real tqdm drawings, as a log holds them."""

from __future__ import annotations

import io

import pytest
from tqdm import tqdm

from gpuwarden.core.bar_follow import BarFollow
from gpuwarden.core.progress_bar import (
    BarReading,
    bar_payload,
    bar_readings,
    bar_sentence,
    recorded_bar,
)


def current_bar(text: str) -> BarReading | None:
    """The last drawing in `text`."""
    readings = bar_readings(text)
    return readings[-1] if readings else None


def drawn(total: int | None, steps: int, **options: object) -> str:
    """What tqdm writes to a file (a log) for `steps` updates of a bar."""
    out = io.StringIO()
    bar = tqdm(total=total, file=out, mininterval=0, **options)
    for _ in range(steps):
        bar.update(1)
        bar.set_postfix(loss=0.25)
    bar.close()
    return out.getvalue()


def test_a_bar_with_a_total_reads_as_its_count_rate_and_estimate() -> None:
    reading = current_bar(drawn(40, 12, desc="train"))
    assert reading is not None
    assert (reading.desc, reading.n, reading.total, reading.unit) == ("train", 12, 40, "it")
    assert reading.rate is not None and reading.rate > 0
    assert reading.remaining_s is not None and reading.fraction == pytest.approx(0.3)
    assert not reading.counts_an_epoch


def test_the_trainers_bar_has_no_description() -> None:
    line = "\r 12%|█▎        | 5/40 [00:02<00:14,  2.45it/s]\r{'loss': 1.2}\n"
    assert current_bar(line) == BarReading("", 5, 40, "it", 2.45, 2, 14)


def test_a_slow_rate_is_written_per_item_and_read_per_second() -> None:
    reading = current_bar("Epoch 0:  40%|████      | 4/10 [01:00<01:30,  1.50s/it, v_num=0]")
    assert reading is not None
    assert reading.rate == pytest.approx(1 / 1.5)
    assert (reading.elapsed_s, reading.remaining_s) == (60, 90)
    assert reading.counts_an_epoch and reading.desc == "Epoch 0"


def test_scaled_units_and_a_bar_without_a_total() -> None:
    out = io.StringIO()
    bar = tqdm(file=out, mininterval=0, unit="B", unit_scale=True, desc="download")
    bar.update(123_456)
    bar.update(100_000)
    bar.close()
    reading = current_bar(out.getvalue())
    assert reading is not None
    assert (reading.desc, reading.n, reading.total, reading.unit) == ("download", 223_000, None, "B")
    assert reading.fraction is None and reading.remaining_s is None
    scaled = current_bar("tokens: 50%|#####     | 1.20k/2.40k [00:10<00:10, 1.20kB/s]")
    assert scaled is not None and (scaled.n, scaled.total, scaled.rate, scaled.unit) == (
        1200,
        2400,
        1200,
        "B",
    )


def test_a_bar_before_its_first_rate_has_none() -> None:
    reading = current_bar(drawn(40, 0, desc="train").split("\n")[0])
    assert reading is not None and reading.n == 0 and reading.rate is None and reading.remaining_s is None


def followed(*logs: str, start: float = 0.0, every: float = 2.0) -> BarFollow:
    """A follow that read `logs` one after another, `every` seconds apart."""
    follow = BarFollow()
    for number, text in enumerate(logs):
        follow.see(bar_readings(text), start + number * every)
    return follow


def test_an_evaluation_bar_below_the_training_bar_does_not_take_its_place() -> None:
    training = drawn(100, 30, desc="train")
    evaluating = drawn(500, 20, desc="eval", position=1, leave=False)
    follow = followed(training.rstrip("\n"), evaluating)
    assert follow.main is not None and (follow.main.desc, follow.main.n) == ("train", 30)
    follow = followed(training.rstrip("\n"), evaluating, drawn(100, 31, desc="train"))
    assert follow.main is not None and (follow.main.desc, follow.main.n) == ("train", 31)


def test_a_finished_or_abandoned_bar_hands_over_to_the_latest() -> None:
    epochs = followed(drawn(10, 10, desc="epoch 1"), drawn(10, 3, desc="epoch 2"))
    assert epochs.main is not None and (epochs.main.desc, epochs.main.n) == ("epoch 2", 3)
    broken = followed(drawn(100, 40, desc="train"), drawn(10, 3, desc="search"), every=61.0)
    assert broken.main is not None and broken.main.desc == "search"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "step 5 [10:22] loss 0.3",
        "2026-11-29 15:46:05 [INFO] 12/40 done",
        "epoch 3/10 [12:30:00]",
        "\x1b[31merror\x1b[0m: out of memory",
    ],
)
def test_text_that_is_no_bar_reads_as_none(text: str) -> None:
    assert bar_readings(text) == []
    assert current_bar(text) is None


def test_a_drawing_is_recorded_when_it_moved_a_hundredth_a_minute_passed_or_another_bar_came() -> None:
    follow = BarFollow()

    def due(reading: BarReading, now: float) -> BarReading | None:
        follow.see([reading], now)
        return follow.due(now)

    first = BarReading("train", 0, 1000, "it", None, 0, None)
    assert due(first, 0.0) == first
    assert follow.due(500.0) is None  # nothing new
    assert due(BarReading("train", 5, 1000, "it", 5.0, 1, 199), 1.0) is None
    assert due(BarReading("train", 10, 1000, "it", 5.0, 2, 198), 2.0) is not None
    assert due(BarReading("train", 15, 1000, "it", 5.0, 61, 199), 62.0) is not None
    follow.see([BarReading("train", 16, 1000, "it", 5.0, 62, 199)], 62.5)
    assert follow.due(62.5) is None and follow.due(62.5, ended=True) is not None  # its last drawing
    assert due(BarReading("eval", 1, 50, "it", 5.0, 1, 10), 63.0) is None  # the training bar stays
    assert due(BarReading("train", 1000, 1000, "it", 5.0, 200, 0), 64.0) is not None
    assert due(BarReading("eval", 1, 50, "it", 5.0, 1, 10), 65.0) is not None  # after it finished
    follow.see([BarReading("eval", 1, 50, "it", 1.0, 2, 49)], 66.0)  # moved, but not its count
    assert follow.due(66.0) is None


def test_a_recorded_drawing_reads_back_as_a_sentence() -> None:
    reading = BarReading("train", 12, 40, "it", 3.92, 3, 7)
    assert recorded_bar(bar_payload(reading)) == reading
    assert bar_sentence(reading) == "train: 12/40 it (30 %), 3.92 it/s, 7s left"
    epoch = BarReading("Epoch 3", 4, 10, "it", 2.9, 1, 2)
    assert bar_sentence(epoch) == "Epoch 3: 4/10 it (40 % of the epoch), 2.9 it/s, 2s left in the epoch"
    assert bar_sentence(BarReading("", 223_000, None, "B", None, 0, None)) == "223000 B"
    slow = BarReading("", 6, 30, "it", 1 / 3.5, 21, 84)
    assert bar_sentence(slow) == "6/30 it (20 %), 3.5 s/it, 1m24s left"
    assert recorded_bar({"n": "lots"}) is None and recorded_bar({}) is None


def test_a_bar_that_wipes_its_line_as_it_closes_is_over() -> None:
    out = io.StringIO()
    bar = tqdm(total=200, desc="eval", leave=False, file=out, mininterval=0)
    for _ in range(150):  # its last drawing short of its total, as a throttled bar's often is
        bar.update(1)
    bar.close()
    readings = bar_readings(out.getvalue())
    assert readings[-1].n == 150 and readings[-1].erased and not readings[0].erased
    # The next epoch's bar takes over at once, not a minute later.
    follow = followed(drawn(10, 10, desc="epoch 1"), out.getvalue(), drawn(10, 2, desc="epoch 2"))
    assert follow.main is not None and (follow.main.desc, follow.main.n) == ("epoch 2", 2)
