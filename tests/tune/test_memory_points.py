"""Memory points remembered per shape: merged by the worst peak, bounded, and unreadable files
read as nothing remembered."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.core.config.spec import parse_spec
from gpuwarden.core.tune.memory_points import MAX_SIZES, MemoryPoints, memory_key

SPEC = "name: t\nkind: train\ntrain: {task: image, batch_size: 32, grad_accum_steps: 1}\n"


def test_points_merge_by_the_worst_peak_per_size(tmp_path: Path) -> None:
    cache = MemoryPoints(tmp_path / "tune" / "memory")  # made, with its parent, on the first write
    assert cache.get("k") == []
    cache.add("k", [(4, 100), (8, 200)])
    cache.add("k", [(8, 250), (8, 150), (16, 400), (0, 5), (2, -1)])
    assert cache.get("k") == [(4, 100), (8, 250), (16, 400)]
    cache.add("k", [(b, b) for b in range(1, 40)])
    assert len(cache.get("k")) == MAX_SIZES


def test_an_unreadable_file_is_nothing_remembered(tmp_path: Path) -> None:
    cache = MemoryPoints(tmp_path)
    (tmp_path / "k.json").write_text("{not json")
    assert cache.get("k") == []
    (tmp_path / "k.json").write_text('{"key": "other", "points": [[4, 100]]}')
    assert cache.get("k") == []
    (tmp_path / "k.json").write_text('{"key": "k", "points": [[4, 100], ["x", 1], [8], [16, 0]]}')
    assert cache.get("k") == [(4, 100)]


def test_the_key_is_the_shape_and_the_memory_not_the_micro_batch() -> None:
    spec = parse_spec(SPEC)
    retuned = parse_spec(
        SPEC.replace("batch_size: 32, grad_accum_steps: 1", "batch_size: 16, grad_accum_steps: 2")
    )
    key = memory_key(spec, on_gpu=False, capacity=1 << 30)
    assert key is not None and key == memory_key(retuned, on_gpu=False, capacity=1 << 30)
    assert key != memory_key(spec, on_gpu=True, capacity=1 << 30)
    assert memory_key(spec, on_gpu=False, capacity=None) is None
