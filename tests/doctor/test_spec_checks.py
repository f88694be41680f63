"""Static findings on crafted specs, per target, and `--fix` results that doctor finds clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.core.config.spec import spec_from_document
from gpuwarden.core.config.yamlsource import parse_yaml
from gpuwarden.core.doctor.diagnose import diagnose_spec_file, recheck
from gpuwarden.core.doctor.finding import Finding, merged_fix
from gpuwarden.core.doctor.fix import apply_fixes
from gpuwarden.core.doctor.spec_checks import check_spec
from gpuwarden.core.doctor.spec_view import SpecView
from gpuwarden.core.doctor.target import Target, detect_target, parse_gpu_memory
from gpuwarden.core.errors import UserError
from gpuwarden.core.telemetry.fake_nvml import FakeNvml
from gpuwarden.core.telemetry.nvml import NoGpuReader, NvmlReader

REPO = Path(__file__).resolve().parents[2]
NAIVE = REPO / "configs" / "examples" / "naive-image-train.yaml"
GIB = 1 << 30
CPU = Target(device="cpu", source="test", cores=2)
GPU24 = Target(device="gpu", source="test", cores=8, memory_total=24 * GIB)
H100 = Target(device="gpu", source="test", cores=16, memory_total=80 * GIB, gpu_name="H100", bf16=True)
T4 = Target(device="gpu", source="test", cores=4, memory_total=16 * GIB, gpu_name="T4", bf16=False)


def findings(text: str, target: Target) -> dict[str, Finding]:
    doc = parse_yaml(text, "s.yaml")
    found, _ = check_spec(SpecView(spec_from_document(doc), "s.yaml", doc.lines), target)
    return {f.id: f for f in found}


def train(body: str) -> str:
    return "name: t\nkind: train\ntrain:\n  task: image\n" + body


def test_naive_example_on_the_cpu_is_info_only_with_cpu_fixes() -> None:
    d = diagnose_spec_file(NAIVE, reader_factory=lambda: NoGpuReader("no driver"))
    assert d.device.device == "cpu" and "no driver" in d.device.source
    assert {f.severity for f in d.findings} == {"info"}
    fixable = {f.id: f.fix for f in d.findings if f.fixable}
    assert fixable == {
        "sync-every-step": {"train.log_interval": 10},
        "optimizer-unfused": {"train.optimizer.fused": "auto"},
        "micro-batch-small": {"train.batch_size": 16},
    }
    ids = {f.id for f in d.findings}
    assert {
        "precision-fp32",
        "compile-off",
        "tf32-off",
        "data-loading-main-process",
        "channels-last-off",
    } <= ids
    assert any("--gpu-memory" in n for n in d.notes)


def test_naive_example_for_a_24gib_gpu_gets_the_fp32_captcha_findings_as_warnings() -> None:
    d = diagnose_spec_file(NAIVE, gpu_memory=parse_gpu_memory("24GiB"))
    found = {f.id: f for f in d.findings}
    assert {f.severity for f in d.findings} == {"warning"}
    precision = found["precision-fp32"]
    assert precision.evidence == {
        "key": "train.amp",
        "value": False,
        "where": f"{NAIVE}:19",
        "mixed_precision_here": "bf16 or fp16",
    }
    assert precision.fix == {"train.precision": "auto", "train.amp": None}
    assert precision.gain is not None and "20–40 %" in precision.gain
    assert found["sync-every-step"].evidence["where"] == f"{NAIVE}:24"
    batch = found["micro-batch-small"]
    assert batch.evidence["tier"] == "24 GB" and batch.evidence["tier_batch_size"] == 64
    assert batch.fix == {"train.batch_size": 64}
    assert found["data-loading-main-process"].fix == {"train.num_workers": "auto"}


def test_amp_true_is_read_correctly_and_only_noted() -> None:
    found = findings(train("  amp: true\n"), H100)
    assert found["precision-amp-legacy"].severity == "info"
    assert "precision-fp32" not in found
    assert found["precision-amp-legacy"].evidence["where"] == "s.yaml:5"


def test_explicit_fp32_on_a_gpu_and_tf32_on_an_old_gpu() -> None:
    found = findings(train("  precision: fp32\n  tf32: false\n"), H100)
    assert found["precision-fp32"].evidence["key"] == "train.precision"
    assert found["precision-fp32"].fix == {"train.precision": "auto"}
    assert found["tf32-off"].severity == "warning"  # fp32 compute on Ampere+: TF32 matters
    old = findings(train("  precision: fp32\n  tf32: false\n"), T4)
    assert old["tf32-off"].severity == "info" and not old["tf32-off"].fixable
    assert old["precision-fp32"].evidence["mixed_precision_here"] == "fp16 (this GPU has no bf16)"


def test_workers_against_cores() -> None:
    found = findings(train("  num_workers: 28\n  persistent_workers: false\n"), GPU24)
    over = found["workers-oversubscribed"]
    assert over.evidence == {"key": "train.num_workers", "value": 28, "where": "s.yaml:5", "cores": 8}
    assert over.fix == {"train.num_workers": "auto"}
    assert found["workers-not-persistent"].evidence["num_workers"] == 28
    assert "workers-oversubscribed" not in findings(train("  num_workers: 8\n"), GPU24)


def test_defaults_are_clean_except_compile_and_the_default_compile_is_only_info() -> None:
    found = findings(train("  batch_size: 64\n"), GPU24)
    assert set(found) == {"compile-off"}
    assert found["compile-off"].severity == "info" and found["compile-off"].evidence["default"] is True


def test_micro_batch_keeps_the_effective_batch_when_accumulating() -> None:
    spec = "name: l\nkind: train\ntrain:\n  task: causal_lm\n  model: /m\n  data: /d.jsonl\n  batch_size: 1\n  grad_accum_steps: 16\n"
    assert findings(spec, H100)["micro-batch-small"].fix == {
        "train.batch_size": 16,
        "train.grad_accum_steps": 1,
    }
    assert findings(spec, GPU24)["micro-batch-small"].fix == {
        "train.batch_size": 4,
        "train.grad_accum_steps": 4,
    }
    small = spec.replace("grad_accum_steps: 16", "grad_accum_steps: 2")
    # 1 × 2 is still tiny for 80 GB: grow to the tier's batch, without accumulation
    assert findings(small, H100)["micro-batch-small"].fix == {
        "train.batch_size": 16,
        "train.grad_accum_steps": 1,
    }


def test_allocator_env_deprecated_name_is_renamed() -> None:
    text = "name: c\nkind: command\ncommand:\n  argv: [python, x.py]\n  env: {PYTORCH_CUDA_ALLOC_CONF: 'expandable_segments:True'}\n"
    f = findings(text, CPU)["alloc-conf-deprecated"]
    assert f.evidence["key"] == "command.env.PYTORCH_CUDA_ALLOC_CONF" and f.evidence["where"] == "s.yaml:5"
    assert f.fix == {
        "command.env.PYTORCH_CUDA_ALLOC_CONF": None,
        "command.env.PYTORCH_ALLOC_CONF": "expandable_segments:True",
    }
    fixed = apply_fixes(text, f.fix)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in fixed
    command = spec_from_document(parse_yaml(fixed, "f")).command
    assert command is not None and command.env == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}


def test_inference_precision_and_batch_on_a_gpu() -> None:
    text = "name: i\nkind: infer\ninfer:\n  task: generate\n  model: /m\n  input: /p.jsonl\n  precision: fp32\n  batch_size: 1\n"
    found = findings(text, H100)
    assert found["precision-fp32"].fix == {"infer.precision": "auto"}
    assert found["micro-batch-small"].fix == {"infer.batch_size": 128}
    assert "precision-fp32" not in findings(text, CPU)


SPECS = {
    "naive": NAIVE.read_text(),
    "captcha": train(
        "  batch_size: 256\n  amp: true\n  num_workers: 28\n  optimizer: {fused: false}\n  log_interval: 1\n"
    ),
    "flow": "{name: f, kind: train, env: {PYTORCH_CUDA_ALLOC_CONF: 'garbage_collection_threshold:0.6'}, train: {task: image, amp: false, batch_size: 2, channels_last: false}}\n",
    "lm": "name: l\nkind: train\ntrain:\n  task: causal_lm\n  model: /m\n  data: /d.jsonl\n  batch_size: 1\n  grad_accum_steps: 2\n  precision: fp32\n  tf32: false\n",
}


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("target", [CPU, GPU24, H100, T4], ids=["cpu", "24gib", "h100", "t4"])
def test_fix_output_is_clean_of_fixable_findings(name: str, target: Target) -> None:
    text = SPECS[name]
    doc = parse_yaml(text, "s.yaml")
    found, _ = check_spec(SpecView(spec_from_document(doc), "s.yaml", doc.lines), target)
    fixed = apply_fixes(text, merged_fix(found))
    assert [f.id for f in recheck(fixed, "fixed.yaml", target) if f.fixable] == []
    # every key the fixes did not name keeps its value
    before, after = parse_yaml(text, "a").data, parse_yaml(fixed, "b").data
    assert before["name"] == after["name"] and before["kind"] == after["kind"]


def test_gpu_detection_uses_the_largest_gpu_and_its_bf16_support() -> None:
    target = detect_target(None, True, reader_factory=lambda: NvmlReader(FakeNvml("mixed")), cores=4)
    assert target.device == "gpu" and target.bf16 is True and target.memory_total is not None
    assert target.memory_total > 70 * GIB and "H100" in (target.gpu_name or "")
    assert detect_target(None, False, reader_factory=lambda: NvmlReader(FakeNvml("h100"))).device == "cpu"


@pytest.mark.parametrize(
    ("text", "fix"),
    [
        ("lots", "write e.g. 24GiB"),
        ("24", "did you mean 24GiB?"),
        ("0", "give the card's memory, e.g. 24GiB"),  # not "did you mean 0GiB?"
        ("-3GiB", "24GiB"),
    ],
)
def test_bad_gpu_memory_is_a_one_line_error(text: str, fix: str) -> None:
    with pytest.raises(UserError) as err:
        parse_gpu_memory(text)
    assert "\n" not in err.value.message and err.value.message.startswith(f"--gpu-memory {text!r}:")
    assert fix in err.value.message, err.value.message


def test_missing_inputs_are_errors_with_their_line(tmp_path: Path) -> None:
    spec = tmp_path / "lm.yaml"
    spec.write_text(
        "name: lm\nkind: train\ntrain:\n  task: causal_lm\n  model: ./gone\n  data: ./texts.jsonl\n"
    )
    (tmp_path / "texts.jsonl").write_text('{"text": "a"}\n')
    d = diagnose_spec_file(spec, reader_factory=lambda: NoGpuReader("no driver"))
    (missing,) = [f for f in d.findings if f.id == "missing-input"]
    assert d.findings[0] is missing  # errors sort first
    assert missing.severity == "error" and not missing.fixable
    assert missing.title == f"train.model: model directory {tmp_path / 'gone'} does not exist"
    assert missing.evidence == {"key": "train.model", "value": "gone", "where": f"{spec}:5"}
    (tmp_path / "gone").mkdir()
    (tmp_path / "gone" / "config.json").write_text("{}")
    again = diagnose_spec_file(spec, reader_factory=lambda: NoGpuReader("no driver"))
    assert not [f for f in again.findings if f.id == "missing-input"]
