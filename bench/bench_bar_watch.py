"""What reading a script's progress bar costs the daemon: one look at an attempt's logs (every
2 s while they grow), for a tqdm bar redrawn ten times a second, and for the worst output a
look may meet (16 KB of lines made to be slow to scan). CPU time of the daemon's own code: the
reading of what the logs gained, the parse, and following the run's bar."""

from __future__ import annotations

import io
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench.figures import REPEATS, figure_row, main_for
from gpuwarden.core.bar_follow import BarFollow
from gpuwarden.core.progress_bar import bar_readings
from gpuwarden.daemon.supervise.bar_watch import TAIL_BYTES, log_gained

LOOKS = 200


def _two_seconds_of_redraws() -> bytes:
    """Twenty drawings of a Trainer-like bar with a postfix (tqdm's mininterval: 0.1 s)."""
    out = io.StringIO()
    bar = tqdm(total=10_000, desc="train", file=out, mininterval=0)
    for _ in range(20):
        bar.update(1)
        bar.set_postfix(loss=0.3125, lr=3e-4)
    return out.getvalue().encode()


def _hostile() -> bytes:
    lines = ["1" * 1999, ("1/" * 999)[:1999], ("1%|" * 666)[:1999], "1 [" + "1:11" * 490]
    text = "\n".join(lines * 4) + "\n"
    return text.encode()[:TAIL_BYTES]


def _look_us(gain: bytes) -> float:
    """CPU µs of one look whose logs gained `gain` since the last."""
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "stderr.log"
        log.write_bytes(b"")
        follow, offset, spent = BarFollow(), 0, 0.0
        with log.open("ab") as writer:
            for look in range(LOOKS):
                writer.write(gain)
                writer.flush()
                start = time.process_time()
                text, offset = log_gained(log, offset)
                follow.see(bar_readings(text), float(look) * 2)
                follow.due(float(look) * 2)
                spent += time.process_time() - start
    return spent / LOOKS * 1e6


def run() -> list[dict[str, Any]]:
    redraws, hostile = _two_seconds_of_redraws(), _hostile()
    return [
        figure_row(
            f"progress bar: one look, 2 s of tqdm redraws ({len(redraws)} bytes)",
            [_look_us(redraws) for _ in range(REPEATS)],
            "µs CPU/look",
        ),
        figure_row(
            f"progress bar: one look, {len(hostile) // 1024} KB of lines slow to scan",
            [_look_us(hostile) for _ in range(REPEATS)],
            "µs CPU/look",
        ),
    ]


if __name__ == "__main__":
    raise SystemExit(main_for(run))
