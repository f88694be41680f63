"""`missing_inputs`: the model, data and cwd a spec names, checked before it is queued or probed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuwarden.core.config.inputs import missing_inputs
from gpuwarden.core.config.spec import spec_from_mapping


def spec(kind: str, section: dict[str, Any]) -> Any:
    return spec_from_mapping({"name": "x", "kind": kind, kind: section}, label="x.yaml")


def model_dir(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text("{}")
    return root


def test_everything_present_is_clean(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "m")
    texts = tmp_path / "t.jsonl"
    texts.write_text('{"text": "a"}\n')
    images = tmp_path / "imgs"
    images.mkdir()
    assert missing_inputs(spec("train", {"task": "causal_lm", "model": str(model), "data": str(texts)})) == []
    assert missing_inputs(spec("train", {"task": "image"})) == []  # synthetic data
    assert missing_inputs(spec("train", {"task": "image", "data": str(images)})) == []
    assert missing_inputs(spec("infer", {"task": "generate", "model": str(model), "input": str(texts)})) == []
    assert (
        missing_inputs(spec("infer", {"task": "image_to_text", "model": str(model), "input": str(images)}))
        == []
    )
    assert missing_inputs(spec("command", {"argv": ["true"], "cwd": str(tmp_path)})) == []


def test_each_missing_input_is_one_line_naming_its_key(tmp_path: Path) -> None:
    texts = tmp_path / "t.jsonl"
    texts.write_text("{}\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert missing_inputs(
        spec("train", {"task": "causal_lm", "model": str(tmp_path / "m"), "data": str(tmp_path)})
    ) == [
        f"train.model: model directory {tmp_path / 'm'} does not exist",
        f"train.data: {tmp_path} is not a file (causal_lm reads JSON or JSONL texts)",
    ]
    assert missing_inputs(spec("train", {"task": "causal_lm", "model": str(empty), "data": str(texts)})) == [
        f"train.model: {empty} has no config.json (a directory save_pretrained() wrote)"
    ]
    assert missing_inputs(spec("train", {"task": "image", "data": str(texts)})) == [
        f"train.data: {texts} is not a folder of images (leave it out for synthetic data)"
    ]
    assert missing_inputs(spec("infer", {"task": "generate", "model": str(empty), "input": str(empty)}))[
        1
    ] == (f"infer.input: {empty} is not a file (generate reads a JSONL file of prompts)")
    assert missing_inputs(spec("command", {"argv": ["true"], "cwd": str(tmp_path / "gone")})) == [
        f"command.cwd: directory {tmp_path / 'gone'} does not exist"
    ]


def test_a_causal_lm_tokenizer_must_be_a_directory(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "m")
    texts = tmp_path / "t.jsonl"
    texts.write_text('{"text": "a"}\n')
    section = {
        "task": "causal_lm",
        "model": str(model),
        "tokenizer": str(tmp_path / "tok"),
        "data": str(texts),
    }
    assert missing_inputs(spec("train", section)) == [
        f"train.tokenizer: directory {tmp_path / 'tok'} does not exist"
    ]


def test_a_program_named_by_a_relative_path_must_be_in_the_commands_folder(tmp_path: Path) -> None:
    (tmp_path / "train.sh").write_text("#!/bin/sh\n")
    here = str(tmp_path)
    assert missing_inputs(spec("command", {"argv": ["./train.sh"], "cwd": here})) == []
    assert missing_inputs(spec("command", {"argv": ["python", "x.py"]})) == []  # on PATH, found per attempt
    assert missing_inputs(spec("command", {"argv": ["./trian.sh"], "cwd": here})) == [
        f"command.argv[0]: ./trian.sh is not in {here}"
    ]
    assert missing_inputs(spec("command", {"argv": ["bin/train"]})) == [
        "command.argv[0]: bin/train is relative to no folder (set command.cwd, or give an absolute path)"
    ]


def test_a_python_script_that_is_not_there_is_refused_whatever_the_interpreters_options(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    here = str(tmp_path)

    def problems(*argv: str) -> list[str]:
        return missing_inputs(spec("command", {"argv": list(argv), "cwd": here}))

    assert problems("python", "train.py", "--lr", "0.1") == []
    assert problems("/usr/bin/python3.11", "-u", "-X", "dev", "train.py") == []
    assert problems("python", "trian.py") == [f"command.argv[1]: the script trian.py is not in {here}"]
    assert problems("python3", "-W", "ignore", "-u", "trian.py", "x.py") == [
        f"command.argv[4]: the script trian.py is not in {here}"
    ]
    # No script file: a module, a string of code, standard input, one filled in per attempt, or
    # not Python at all.
    assert problems("python", "-m", "nosuch.module") == []
    assert problems("python", "-c", "print(1)") == []
    assert problems("python", "-") == []
    assert problems("python", "{script}") == []
    assert problems("pythonista", "nosuch.py") == [] and problems("torchrun", "nosuch.py") == []
