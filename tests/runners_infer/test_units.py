"""Prompt parsing, output naming, pixel budgets and report arithmetic (in-process, fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.core.errors import UserError
from gpuwarden.runners.infer.common import steps_before
from gpuwarden.runners.infer.generate import output_path, read_prompts
from gpuwarden.runners.infer.image_to_text import _apply_pixel_limits, fit_pixels, list_images, output_names
from gpuwarden.runners.infer.report import EnergyMeter, InferReport


def test_prompts_without_id_get_their_line_number(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"q": "a", "key": "x"}\n\n{"q": "b"}\n{"q": "c", "key": null}\n', encoding="utf-8")
    items = read_prompts(path, "q", "key")
    assert [(i.id, i.prompt, i.line) for i in items] == [("x", "a", 1), (3, "b", 3), (4, "c", 4)]


def test_duplicate_ids_are_refused_with_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a", "id": 7}\n{"prompt": "b", "id": 7}\n', encoding="utf-8")
    with pytest.raises(UserError, match="line 1") as info:
        read_prompts(path, "prompt", "id")
    assert info.value.code == "bad_data" and ":2:" in str(info.value)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"text": "a"}\n', "no string field 'prompt'"),
        ("not json\n", "not valid JSON"),
        ('["a"]\n', "expected a JSON object"),
        ("[" * 100_000 + "\n", "nested too deeply"),
    ],
)
def test_malformed_prompt_lines_name_the_line(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(UserError, match=expected):
        read_prompts(path, "prompt", "id")


def test_output_path_file_or_folder(tmp_path: Path) -> None:
    assert output_path(None, tmp_path) == tmp_path / "outputs" / "generations.jsonl"
    assert output_path(tmp_path / "answers.jsonl", tmp_path) == tmp_path / "answers.jsonl"
    assert output_path(tmp_path / "answers", tmp_path) == tmp_path / "answers" / "generations.jsonl"


def test_fit_pixels_keeps_aspect_within_limits() -> None:
    w, h = fit_pixels((2000, 1000), 786_432, None)
    assert w * h <= 786_432 and abs(w / h - 2.0) < 0.01
    assert fit_pixels((100, 50), 786_432, None) == (100, 50)
    w, h = fit_pixels((10, 20), None, 800)
    assert w * h >= 800 and abs(h / w - 2.0) < 0.1


def test_image_listing_and_colliding_stems(tmp_path: Path) -> None:
    for name in ("b.PNG", "a.png", "a.jpg", "c.tif", ".hidden.png", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub.png").mkdir()
    images = list_images(tmp_path)
    assert [p.name for p in images] == ["a.jpg", "a.png", "b.PNG", "c.tif"]
    assert output_names(images, ".md") == {
        "a.jpg": "a.jpg.md",
        "a.png": "a.png.md",
        "b.PNG": "b.md",
        "c.tif": "c.md",
    }


def test_pixel_limits_go_to_processors_that_take_them(tmp_path: Path) -> None:
    from transformers import Qwen2VLImageProcessorPil, ViTImageProcessorPil

    Qwen2VLImageProcessorPil().save_pretrained(tmp_path / "qwen")
    ViTImageProcessorPil().save_pretrained(tmp_path / "vit")
    qwen, applied = _apply_pixel_limits(Qwen2VLImageProcessorPil(), tmp_path / "qwen", 786_432, 3136)
    assert applied and (qwen.size.longest_edge, qwen.size.shortest_edge) == (786_432, 3136)
    vit = ViTImageProcessorPil()
    same, applied = _apply_pixel_limits(vit, tmp_path / "vit", 786_432, 3136)
    assert not applied and same is vit  # the runner resizes the image itself instead


def test_report_per_batch_size_statistics(tmp_path: Path) -> None:
    report = InferReport(task="generate", attempt=2, device="cpu", dtype="fp32", batch_size=4, output="o")
    report.items_total, report.items_done_before = 10, 3
    report.record_batch(4, 2.0, tokens_in=40, tokens_out=80)
    report.record_batch(3, 1.0, tokens_in=30, tokens_out=30)
    data = report.write(tmp_path)
    assert data["items_processed"] == 7 and data["items_remaining"] == 0
    assert data["items_per_s"] == pytest.approx(7 / 3, rel=1e-3)
    assert data["tokens_per_s"] == pytest.approx(110 / 3, rel=1e-3)
    assert data["per_batch_size"]["4"] == {
        "batches": 1,
        "items": 4,
        "mean_batch_s": 2.0,
        "mean_item_s": 0.5,
        "tokens_out": 80,
    }
    assert (tmp_path / "report.json").exists()


def test_energy_is_none_without_a_gpu() -> None:
    assert EnergyMeter("cpu").joules() is None


def test_steps_count_on_from_the_last_step_earlier_attempts_reported(tmp_path: Path) -> None:
    def attempt(n: int, text: str) -> None:
        (tmp_path / "attempts" / str(n)).mkdir(parents=True)
        (tmp_path / "attempts" / str(n) / "events.jsonl").write_text(text, encoding="utf-8")

    progress = '{{"v": 1, "type": "progress", "ts": 1, "step": {}}}\n'
    attempt(1, progress.format(1) + progress.format(2) + '{"v": 1, "type": "oom", "ts": 1, "step": 99}\n')
    attempt(2, progress.format(3) + progress.format(5) + '{"v": 1, "type": "progr')  # killed mid-line
    assert steps_before(tmp_path, 1) == 0
    assert steps_before(tmp_path, 2) == 2
    assert steps_before(tmp_path, 3) == 5
    assert steps_before(tmp_path, 5) == 5  # attempt 4 wrote nothing
