"""The layering rules, checked in a fresh interpreter (import-linter cannot see deferred imports)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuwarden.core.events import EXIT_USER_ERROR

HEAVY = ("torch", "transformers", "accelerate", "textual", "rich", "matplotlib")
# What sqlite-utils would import whenever it is installed (a training machine has both): the
# daemon and the dashboard pay for neither.
DATAFRAMES = ("numpy", "pandas")


def _modules_after_importing(packages: list[str]) -> set[str]:
    """Import every module under `packages` in a new interpreter; return sys.modules' top names
    plus every gpuwarden module loaded."""
    code = textwrap.dedent(
        f"""
        import importlib, json, pkgutil, sys
        for name in {packages!r}:
            pkg = importlib.import_module(name)
            for info in pkgutil.walk_packages(pkg.__path__, name + "."):
                if info.name.endswith("__main__"):
                    continue
                importlib.import_module(info.name)
        print(json.dumps(sorted(sys.modules)))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return set(json.loads(out.stdout))


def _top(mods: set[str]) -> set[str]:
    return {m.split(".")[0] for m in mods}


def test_core_and_daemon_never_load_heavy_or_ui_modules() -> None:
    mods = _modules_after_importing(["gpuwarden.core", "gpuwarden.daemon"])
    heavy = {*HEAVY, *DATAFRAMES}
    assert not (_top(mods) & heavy), sorted(_top(mods) & heavy)
    assert not {m for m in mods if m.startswith(("gpuwarden.tui", "gpuwarden.runners"))}


def test_cli_entry_point_stays_light() -> None:
    """Every CLI module imports without torch/transformers/textual (they load inside commands).
    `rich` is allowed here: httpx imports its own CLI, and with it rich, whenever rich is
    installed — fine for a client, which is why the daemon never imports httpx."""
    mods = _modules_after_importing(["gpuwarden.cli"])
    heavy = set(HEAVY) - {"rich"}
    assert not (_top(mods) & heavy), sorted(_top(mods) & heavy)


def test_daemon_command_chain_never_loads_rich_or_httpx() -> None:
    """What `gpuwarden daemon` imports before serving: the entry point, its command, the daemon."""
    code = (
        "import sys, json, gpuwarden.cli.main, gpuwarden.cli.daemon_cmds, gpuwarden.daemon.daemon;"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    mods = _top(set(json.loads(out.stdout)))
    assert not (mods & {*HEAVY, *DATAFRAMES, "httpx"}), sorted(mods & {*HEAVY, *DATAFRAMES, "httpx"})


def test_runners_never_import_daemon_or_tui() -> None:
    pytest.importorskip("torch")
    mods = _modules_after_importing(["gpuwarden.runners"])
    assert not {m for m in mods if m.startswith(("gpuwarden.daemon", "gpuwarden.tui"))}
    assert "textual" not in _top(mods)


def test_tui_never_imports_torch_or_daemon() -> None:
    mods = _modules_after_importing(["gpuwarden.tui"])
    assert not (_top(mods) & {"torch", "transformers", "accelerate", *DATAFRAMES})
    assert not {m for m in mods if m.startswith(("gpuwarden.daemon", "gpuwarden.runners"))}


def test_the_script_sdk_stays_light_even_when_it_classifies() -> None:
    """A user's script imports the SDK: standard library only, never torch (it reads torch's
    numbers only when the script imported torch itself), pydantic or the daemon."""
    code = (
        "import sys, json, gpuwarden.sdk as sdk;"
        "from gpuwarden.sdk.guard import report_oom;"
        "report_oom(MemoryError('x'), reporter=sdk.Reporter(None));"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    mods = set(json.loads(out.stdout))
    assert not (_top(mods) & {*HEAVY, "pydantic", "yaml", "lightning"}), sorted(
        _top(mods) & {*HEAVY, "pydantic"}
    )
    assert not {
        m for m in mods if m.startswith(("gpuwarden.daemon", "gpuwarden.client", "gpuwarden.runners"))
    }


def test_a_runner_refusing_its_spec_never_loads_torch(tmp_path: Path) -> None:
    """The runner's entry point reports a spec error before anything heavy loads (a refused spec
    costs a fraction of a second, not torch's import)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("kind: train\nname: x\ntrain: {micro_batch: -3}\n")
    code = (
        "import sys, json, gpuwarden.runners.__main__ as entry;"
        f"status = entry.main(['--spec', {str(spec)!r}, '--run-dir', {str(tmp_path / 'run')!r}]);"
        "print(json.dumps([status, sorted(sys.modules)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    status, mods = json.loads(out.stdout.splitlines()[-1])
    assert status == EXIT_USER_ERROR, out.stderr
    assert "gpuwarden: " in out.stderr and "Traceback" not in out.stderr
    assert not (_top(set(mods)) & set(HEAVY)), sorted(_top(set(mods)) & set(HEAVY))


def test_the_slurm_adapter_loads_nothing_of_gpuwarden_but_core() -> None:
    """A Slurm job imports the adapter to read its environment and requeue itself: nothing of
    gpuwarden beyond core (a package added later included), nothing heavy."""
    mods = _modules_after_importing(["gpuwarden.slurm"])
    ours = {m for m in mods if m.startswith("gpuwarden.")}
    assert all(m.startswith(("gpuwarden.core", "gpuwarden.slurm")) for m in ours), sorted(ours)
    assert not (_top(mods) & {*HEAVY, *DATAFRAMES}), sorted(_top(mods) & {*HEAVY, *DATAFRAMES})
