"""A Python script's next attempt, started before it is needed.

`python -c STUB THIS_FILE -- script.py ARGS…` (or `-- -m module ARGS…`) imports the libraries
the script imports at its top (torch, transformers, lightning …, and torch's compiler front end,
which every optimizer's first step imports), then waits on its standard input. The end of its
input: it exits. A line naming a JSON file: the attempt as the daemon prepared it (argv,
environment, working folder, output files), and it runs the script there as `python script.py`
would, in this interpreter whose imports are done. A restart after an out-of-memory then pays
the script's own start, not seconds of importing its libraries again.

It runs in the user's interpreter (which may not have gpuwarden), so it needs only the standard
library, and starts from a one-line `-c` (as `python THIS_FILE` it would have gpuwarden's own
folder first on its import path). Only libraries found outside the script's folder and the
working folder are imported early: the user's own modules run when the script imports them.
What a library reads from the environment as it is imported is read from the same environment:
the daemon hands over only an attempt whose environment differs in the variables it sets for each
attempt (and those bound to the run's knobs).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import importlib.util
import json
import os
import runpy
import sys
import threading
import types
from importlib.machinery import PathFinder, SourceFileLoader
from types import TracebackType
from typing import Any

# What starts this file in the user's interpreter; the file's path follows it.
STUB = "import sys; p = sys.argv[1]; exec(compile(open(p, 'rb').read(), p, 'exec'))"

# What the imports printed (a library's warning) belongs to the attempt's output: copied there
# from the files the standby wrote to, up to this much of each.
_PRELUDE_LIMIT = 1 << 16
# Imported after torch whenever the script imports torch: every optimizer's first step imports it
# (about a second), so a training script always pays it.
_AFTER_TORCH = ("torch._dynamo",)
# Never imported early: gpuwarden's SDK reads the attempt's variables, which are not yet set.
_SKIPPED = frozenset({"gpuwarden", "__future__"})
LOWEST_PRIORITY = 19  # the nice value of the thread that imports while an attempt runs
EXIT_CANNOT_START = 127  # as the exit-status recorder and a shell answer for what cannot start


def top_imports(source: str) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names) of the absolute imports at a script's top level (also those inside a
    top-level `try` or `if`), in order: `import a.b` → ("a.b", ()), `from a import b, c` →
    ("a", ("b", "c"))."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: list[tuple[str, tuple[str, ...]]] = []
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.Import):
            found.extend((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.module, tuple(alias.name for alias in node.names if alias.name != "*")))
        elif isinstance(node, ast.Try):
            body[:0] = [*node.body, *node.orelse, *node.finalbody]
        elif isinstance(node, ast.If):
            body[:0] = [*node.body, *node.orelse]
    return found


def _outside(module: str, folders: tuple[str, ...]) -> bool:
    """Whether `module`'s top-level package is a library: found, and not directly in one of
    `folders` (the script's, the working one), where the user's own modules are. A virtualenv
    inside the project folder is a library's place, not the user's code."""
    top = module.partition(".")[0]
    if top in _SKIPPED:
        return False
    try:
        if any(PathFinder.find_spec(top, [folder]) is not None for folder in folders):
            return False
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def preload(source: str, folders: tuple[str, ...]) -> list[str]:
    """Import the libraries `source` imports at its top; the top-level names imported. A library
    that fails to import is left for the script to import (and fail on) itself."""
    done: list[str] = []
    for module, names in top_imports(source):
        if not _outside(module, folders):
            continue
        try:
            loaded = importlib.import_module(module)
            for name in names:
                getattr(loaded, name, None)  # lazy packages (transformers) load the named part here
        except Exception:
            continue
        top = module.partition(".")[0]
        if top not in done:
            done.append(top)
    if "torch" in done:
        for module in _AFTER_TORCH:
            try:
                importlib.import_module(module)
            except Exception:
                continue
    return done


def _target(program: list[str]) -> tuple[str, bool]:
    """(script path or module name, is a module) of `[script, …]` or `[-m, module, …]`."""
    if program[0] == "-m":
        return program[1], True
    return program[0], False


def _path_head(target: str, module: bool) -> str:
    """What `python script.py` (its folder) or `python -m` (the working folder) puts first on
    the import path."""
    return os.getcwd() if module else os.path.dirname(os.path.realpath(target))


def _redirect(fd: int, path: str, prelude: str | None) -> None:
    """Point `fd` at `path` (appended to), after moving there what the file `prelude` (where
    `fd` wrote so far) holds."""
    new = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    if prelude:
        try:
            with open(prelude, "rb") as old:
                os.write(new, old.read(_PRELUDE_LIMIT))
            os.unlink(prelude)
            os.rmdir(os.path.dirname(prelude))  # the standby's folder, once both are moved
        except OSError:
            pass
    os.dup2(new, fd)
    os.close(new)


def _take(order: dict[str, Any]) -> list[str]:
    """Become the attempt `order` describes; the script's argv."""
    argv = [str(a) for a in order["argv"]]
    env = {str(k): str(v) for k, v in order["env"].items()}
    sys.stdout.flush()
    sys.stderr.flush()
    _redirect(1, str(order["stdout"]), order.get("stdout_before"))
    _redirect(2, str(order["stderr"]), order.get("stderr_before"))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(str(order["cwd"]))
    os.environ.clear()
    os.environ.update(env)
    return argv[1:]


def _trimmed(tb: TracebackType | None, own: set[str]) -> TracebackType | None:
    """`tb` without the frames of `own` files: the traceback the script would print."""
    while tb is not None and tb.tb_frame.f_code.co_filename in own:
        tb = tb.tb_next
    return tb


def _run(program: list[str], boot: str) -> None:
    target, module = _target(program)
    sys.argv = [target, *program[2:]] if module else list(program)
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            _run_script(target)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        # Python prints the exception's own traceback, whatever the hook is handed: both trimmed.
        tb = _trimmed(exc.__traceback__, {"<string>", "<frozen runpy>", boot, runpy.__file__})
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        sys.exit(1)


def _run_script(target: str) -> None:
    """Run the script as `python target` does: in a fresh `__main__` module, its `__file__`
    absolute and `sys.argv[0]` as given (`runpy.run_path` would make both the path it is given)."""
    path = os.path.abspath(target)
    with open(path, "rb") as fh:
        code = compile(fh.read(), path, "exec")
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__loader__ = SourceFileLoader("__main__", path)
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _source_of(target: str, module: bool, folders: tuple[str, ...]) -> str:
    """The script's source; a module's, found in `folders` by its path (finding it through the
    import system would run its packages' `__init__` now), else as a library."""
    try:
        if module:
            parts = target.split(".")
            found = [
                candidate
                for folder in folders
                for candidate in (
                    os.path.join(folder, *parts) + ".py",
                    os.path.join(folder, *parts, "__main__.py"),
                )
                if os.path.isfile(candidate)
            ]
            if not found and _outside(target, folders):
                spec = importlib.util.find_spec(target)
                origin = spec.origin if spec is not None else None
                found = [origin] if origin is not None and origin.endswith(".py") else []
            if not found:
                return ""
            target = found[0]
        with open(target, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except (OSError, ImportError, ValueError):
        return ""


def _set_path_head(head: str) -> None:
    """Put `head` first on the import path, as Python does for a script — unless it was told
    not to (`-P`, PYTHONSAFEPATH)."""
    if not getattr(sys.flags, "safe_path", False):
        sys.path[0] = head


class _Handover:
    """Whether the standby was handed its attempt, and whether it left before: one or the other."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handed = False

    def hand(self) -> None:
        with self._lock:
            self._handed = True

    def leave_unless_handed(self, why: str) -> None:
        """Exit now unless an attempt was handed over (then it runs, and this is its process)."""
        with self._lock:
            if not self._handed:
                # Not 0: an order sent as this happens then ends its attempt as failed, not done.
                sys.stderr.write(f"gpuwarden: the standby left: {why}\n")
                os._exit(EXIT_CANNOT_START)


def _preload_aside(source: str, folders: tuple[str, ...], handover: _Handover) -> threading.Thread:
    """Preload on a thread at the lowest priority (a thread's nice value is its own): while the
    attempt it waits beside starts and runs, it takes only what that attempt leaves of the CPU,
    and the thread that later runs the script keeps the interpreter's own priority."""

    def work() -> None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)
        preloaded = preload(source, folders)
        torch = sys.modules.get("torch") if "torch" in preloaded else None
        if torch is not None and torch.cuda.is_initialized():
            # Waiting, it would hold a GPU the running attempt may need.
            handover.leave_unless_handed("importing the script's libraries started CUDA")

    thread = threading.Thread(target=work, name="gpuwarden-preload", daemon=True)
    thread.start()
    return thread


def _order(line: str) -> dict[str, Any]:
    """The attempt handed over, from the file `line` names (read once, then removed)."""
    try:
        with open(line, encoding="utf-8") as fh:
            order: dict[str, Any] = json.load(fh)
        os.unlink(line)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"gpuwarden: the attempt handed over cannot be read: {exc}\n")
        sys.exit(EXIT_CANNOT_START)
    return order


def main(args: list[str]) -> None:
    """`THIS_FILE -- script.py ARGS…` or `THIS_FILE -- -m module ARGS…`: preload, wait, then run
    the attempt or exit."""
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: python -c STUB warm_boot.py -- script.py [ARGS…]\n")
        sys.exit(2)
    boot, program = args[0], args[2:]
    target, module = _target(program)
    _set_path_head(_path_head(target, module))
    folders = tuple(dict.fromkeys((_path_head(target, module), os.path.realpath(os.getcwd()))))
    handover = _Handover()
    preloading = _preload_aside(_source_of(target, module, folders), folders, handover)
    line = sys.stdin.readline().strip()
    if not line:
        os._exit(0)  # let go: whatever the preload thread is doing
    handover.hand()
    order = _order(line)
    preloading.join()  # the CPU the last attempt held is free now
    program = _take(order)
    _set_path_head(_path_head(_target(program)[0], module))
    _run(program, boot)


if __name__ == "__main__":
    main(sys.argv[1:])
