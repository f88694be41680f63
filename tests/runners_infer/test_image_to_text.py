"""`task: image_to_text` end to end with the tiny TrOCR-style model, as a real runner process."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwarden.core.events import EXIT_OK

from .conftest import RunResult, read_jsonl, write_spec

Runner = Callable[..., RunResult]


def image_folder(tmp_path: Path, source: Path) -> Path:
    """A copy of the session's images plus one file that is not an image at all."""
    folder = tmp_path / "pages"
    shutil.copytree(source, folder)
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not a png")
    (folder / "notes.txt").write_text("ignored: not an image", encoding="utf-8")
    return folder


@pytest.mark.slow
# Long: the resume half starts from the first run's outputs; apart, the model would run once more.
def test_image_to_text_finishes_and_resumes(
    tmp_path: Path, vlm_assets: dict[str, Path], run_runner: Runner
) -> None:
    # Markdown here; the JSON records are checked with the chat VLM (test_decoder_only_chat_vlm).
    folder = image_folder(tmp_path, vlm_assets["images"])
    out_dir = tmp_path / "texts"
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "task": "image_to_text",
            "model": vlm_assets["vlm"],
            "input": folder,
            "output": out_dir,
            "output_format": "markdown",
            "prompt": "Convert this page to Markdown.",
            "batch_size": 4,
            "max_new_tokens": 12,
            "max_pixels": 1500,
        },
    )
    result = run_runner(spec, tmp_path / "run")
    assert result.rc == EXIT_OK, result.stderr

    # The unreadable file: a warning naming it, a failed index row, and the run goes on.
    (warning,) = result.warnings("unreadable_image")
    assert "broken.png" in warning["message"]
    index = {row["id"]: row for row in read_jsonl(out_dir / "index.jsonl")}
    assert index["broken.png"]["status"] == "failed" and index["broken.png"]["error"]
    good = sorted(p.name for p in vlm_assets["images"].iterdir())
    assert sorted(name for name, row in index.items() if row["status"] == "ok") == good

    outputs = sorted(p.name for p in out_dir.iterdir() if p.name != "index.jsonl")
    assert outputs == sorted(Path(name).stem + ".md" for name in good)
    for name in good:
        text = (out_dir / (Path(name).stem + ".md")).read_text(encoding="utf-8")
        assert text.endswith("\n") and text.strip()

    report = result.one("finished")["report"]
    assert report == json.loads((tmp_path / "run" / "report.json").read_text(encoding="utf-8"))
    assert (report["items_total"], report["items_processed"], report["items_failed"]) == (7, 6, 1)
    assert sum(stats["items"] for stats in report["per_batch_size"].values()) == 6
    assert report["tokens_out"] > 0 and report["items_per_s"] > 0

    # As if the attempt had died between renaming an output into place and appending its index
    # row, with another output's temporary left behind: the second attempt finds everything done
    # (the failed image included), records the missing row, removes the temporary and writes
    # nothing else.
    index_path = out_dir / "index.jsonl"
    lines = index_path.read_text(encoding="utf-8").splitlines(keepends=True)
    index_path.write_text(
        "".join(line for line in lines if json.loads(line)["id"] != good[0]), encoding="utf-8"
    )
    before = {p.name: p.stat().st_mtime_ns for p in out_dir.glob("*.md")}
    (out_dir / ".gpuwarden-tmp-999-other.md").write_text("half", encoding="utf-8")
    again = run_runner(spec, tmp_path / "run", attempt=2)
    assert again.rc == EXIT_OK, again.stderr
    assert again.one("started")["samples_seen"] == 7
    assert again.one("finished")["report"]["items_processed"] == 0
    assert {p.name: p.stat().st_mtime_ns for p in out_dir.glob("*.md")} == before
    rows = read_jsonl(index_path)
    assert sorted(r["id"] for r in rows) == sorted(index)
    recovered = next(r for r in rows if r["id"] == good[0])
    assert recovered["recovered"] is True and recovered["attempt"] == 2


@pytest.mark.slow
def test_decoder_only_chat_vlm(tmp_path: Path, vlm_assets: dict[str, Path], run_runner: Runner) -> None:
    # The Qwen2-VL path: chat template + processor-expanded image tokens + left padding.
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "task": "image_to_text",
            "model": vlm_assets["chat_vlm"],
            "input": vlm_assets["images"],
            "output_format": "json",
            "prompt": "Describe the page.",
            "batch_size": 4,
            "max_new_tokens": 6,
            "max_pixels": 1000,  # CLIP's processor takes no pixel budget: the runner resizes first
        },
    )
    result = run_runner(spec, tmp_path / "run")
    assert result.rc == EXIT_OK, result.stderr
    assert not result.of_type("warning")
    good = sorted(p.name for p in vlm_assets["images"].iterdir())
    out_dir = tmp_path / "run" / "outputs"
    outputs = sorted(p.name for p in out_dir.iterdir() if p.name != "index.jsonl")
    assert outputs == sorted(Path(name).stem + ".json" for name in good)
    records = [
        json.loads((out_dir / (Path(name).stem + ".json")).read_text(encoding="utf-8")) for name in good
    ]
    assert [r["image"] for r in records] == good
    assert all(r["prompt"] == "Describe the page." for r in records)
    assert all(r["width"] * r["height"] <= 1000 and 0 < r["tokens_out"] <= 6 for r in records)
    report = result.one("finished")["report"]
    # 16 image tokens per picture (4×4 patches) plus the templated prompt, for each of 6 images.
    assert report["tokens_in"] > 6 * 16 and report["items_processed"] == 6
