"""Resumable writers: partial-line repair, keys of done items, atomic files (in-process, fast)."""

from __future__ import annotations

import json
from pathlib import Path

from gpuwarden.runners.infer.outputs import (
    TMP_PREFIX,
    JsonlOutput,
    remove_stale_temps,
    repair_trailing_line,
    write_file_atomic,
)


def test_repair_cuts_partial_last_line(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"id": 1}\n{"id": 2}\n{"id": 3, "out')
    assert repair_trailing_line(path) == len(b'{"id": 3, "out')
    assert path.read_bytes() == b'{"id": 1}\n{"id": 2}\n'
    assert repair_trailing_line(path) == 0


def test_repair_of_a_single_partial_line_empties_the_file(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"id": 1, "half')
    assert repair_trailing_line(path) == 15
    assert path.read_bytes() == b""


def test_repair_finds_a_newline_beyond_one_block(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    tail = b"x" * 200_000  # longer than the 64 KiB read-back block
    path.write_bytes(b'{"id": 1}\n' + tail)
    assert repair_trailing_line(path) == len(tail)
    assert path.read_bytes() == b'{"id": 1}\n'


def test_repair_of_missing_or_empty_file_is_a_no_op(tmp_path: Path) -> None:
    assert repair_trailing_line(tmp_path / "absent.jsonl") == 0
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert repair_trailing_line(tmp_path / "empty.jsonl") == 0


def test_jsonl_output_resumes_with_the_ids_written(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "out.jsonl"
    with JsonlOutput(path) as out:
        assert out.rows_before == 0
        out.write({"id": 1, "output": "a"})
        out.write({"id": "1", "output": "b"})
    raw = path.read_bytes()
    assert raw.count(b"\n") == 2 and raw.endswith(b"\n")
    with open(path, "ab") as fh:
        fh.write(b'{"id": 2, "outp')  # a crash in the middle of a line
    with JsonlOutput(path) as out:
        assert out.repaired_bytes == len(b'{"id": 2, "outp')
        assert out.is_done(1) and out.is_done("1")  # 1 and "1" are different items
        assert not out.is_done(2)
        out.write({"id": 2, "output": "c"})
        assert [row["output"] for row in out.rows()] == ["a", "b", "c"]


def test_jsonl_output_counts_foreign_lines_and_keeps_them(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text('{"id": 1}\nnot json\n[1, 2]\n{"other": 3}\n', encoding="utf-8")
    with JsonlOutput(path) as out:
        assert out.bad_lines == 3
        assert out.done == {json.dumps(1)}
    assert "not json" in path.read_text(encoding="utf-8")


def test_write_file_atomic_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "a.md"
    write_file_atomic(target, "hello\n")
    write_file_atomic(target, "again\n")
    assert target.read_text(encoding="utf-8") == "again\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.md"]


def test_stale_temporaries_are_removed(tmp_path: Path) -> None:
    (tmp_path / f"{TMP_PREFIX}123-a.md").write_text("half", encoding="utf-8")
    (tmp_path / "b.md").write_text("done", encoding="utf-8")
    assert remove_stale_temps(tmp_path) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["b.md"]
