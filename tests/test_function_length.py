"""No function runs past 60 lines without saying why: a `# Long:` comment on its def line or in
the 3 lines above it. Past a screenful a function is read in pieces, so a long one should be split
or carry its reason where the reader meets it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("gpuwarden", "bench", "gpucheck", "examples", "tests")
MAX_LINES = 60
MARK = "# Long:"


def long_functions_without_reason(path: Path, root: Path = ROOT) -> list[str]:
    """`file:line name (N lines)` for each function in `path` over MAX_LINES with no reason."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        assert node.end_lineno is not None
        length = node.end_lineno - node.lineno + 1
        if length <= MAX_LINES:
            continue
        # lines are 1-based: the def line is lines[lineno - 1], the three above it before that
        nearby = lines[max(0, node.lineno - 4) : node.lineno]
        if not any(MARK in line for line in nearby):
            found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_long_functions_say_why() -> None:
    offenders = [
        entry
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for entry in long_functions_without_reason(path)
    ]
    assert not offenders, (
        f"functions over {MAX_LINES} lines without a '{MARK}' comment on or just above the def"
        " (split them, or say why not):\n" + "\n".join(offenders)
    )


def test_the_check_finds_a_long_function_and_accepts_a_reason(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    plain = tmp_path / "plain.py"
    plain.write_text(f"def long():\n{body}")
    reasoned = tmp_path / "reasoned.py"
    reasoned.write_text(f"# Long: a table written out\n\ndef long():\n{body}")
    short = tmp_path / "short.py"
    short.write_text("def short():\n" + "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES - 1)))
    assert long_functions_without_reason(plain, tmp_path) == [f"plain.py:1 long ({MAX_LINES + 1} lines)"]
    assert long_functions_without_reason(reasoned, tmp_path) == []
    assert long_functions_without_reason(short, tmp_path) == []
