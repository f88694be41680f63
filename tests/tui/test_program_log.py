"""The Log tab shows a progress bar redrawn in place as one line, as the program's terminal did."""

from __future__ import annotations

from textual.app import App, ComposeResult

from gpuwarden.tui.widgets.program_log import ProgramLog
from tests.tui.conftest import run, until


class Pane(App[None]):
    def compose(self) -> ComposeResult:
        yield ProgramLog(max_lines=100, id="log")


def shown(log: ProgramLog) -> list[str]:
    return ["".join(s.text for s in log.render_line(y)).rstrip() for y in range(log.line_count)]


def test_a_thousand_redraws_of_a_bar_are_one_line_between_the_programs_messages() -> None:
    async def body() -> None:
        app = Pane()
        async with app.run_test(size=(60, 12)) as pilot:
            log = app.query_one(ProgramLog)
            log.write_output("loading model\n")
            for step in range(1, 1001):
                # tqdm writes each redraw as it comes: a chunk may end anywhere in one.
                log.write_output(f"\r\x1b[Atrain {step // 10:3d}%|{step}/1000")
            await until(pilot, lambda: "1000/1000" in " ".join(shown(log)), "the last redraw")
            assert shown(log) == ["loading model", "train 100%|1000/1000"]
            log.write_notice("attempt 2 (retuned: micro-batch 8 × 2)")
            log.write_output("resumed\n")
            await until(pilot, lambda: log.line_count >= 4, "the notice and the next line")
            assert shown(log) == [
                "loading model",
                "train 100%|1000/1000",
                "attempt 2 (retuned: micro-batch 8 × 2)",
                "resumed",
            ]

    run(body())
