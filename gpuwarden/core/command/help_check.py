"""Whether a script takes the resume flag its framework preset would add, asked of its `--help`.

A preset appends `--ckpt_path {resume_from?}` (Lightning) or `--resume_from_checkpoint
{resume_from?}` (Trainer) so that a restart continues from the newest checkpoint. A script that
has no such flag refuses it (`unrecognized arguments`) on its second attempt, and the run ends
failed, so before counting on the flag the script's own help is read once: run with the run's
interpreter and environment, no shell, no GPU, bounded in time and output. The daemon reads it
beside the first attempt, which the flag never reaches (`{resume_from?}` vanishes there), so the
run starts without waiting one start-up of the script for its help; a restart waits for it. A
help that does not list the flag turns it off (`command.resume_flag: false`); a help that cannot
be read leaves it on, as before, and says it was not checked. Either way the user reads one line with the fix.

The runner is injected, so the decision can be tested without a process.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.core.command.config_file import load_config
from gpuwarden.core.command.presets import PRESETS, Preset, apply_preset
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError

HELP_TIMEOUT_S = 20.0
HELP_OUTPUT_LIMIT = 1 << 20  # argparse's help for every TrainingArguments field is about 45 KiB
MISSING_CODE = "resume_flag_missing"
FLAG_MISSING_CODE = "knob_flag_missing"
MISMATCH_CODE = "preset_mismatch"
UNCHECKED_CODE = "resume_flag_unchecked"


@dataclass(frozen=True)
class HelpOutput:
    """What `PROGRAM --help` printed (stdout and stderr together), or why it told nothing."""

    text: str | None
    problem: str = ""  # when text is None: "exited with status 1", "did not finish within 20 s" …


# (argv, environment, working folder, seconds) → its output
HelpRunner = Callable[[list[str], Mapping[str, str], Path, float], HelpOutput]


@dataclass(frozen=True)
class FlagCheck:
    """The spec to submit (the resume flag off when the script lacks it) and the line to say;
    `dropped`: the knobs whose flag the script lacks (no role names them any more), each with a
    line of its own in `more`."""

    spec: RunSpec
    code: str | None = None
    message: str | None = None
    dropped: tuple[str, ...] = ()
    more: tuple[tuple[str, str], ...] = ()

    def lines(self) -> list[tuple[str, str]]:
        """Every (code, message) to say, the resume flag's first."""
        first = [(self.code, self.message)] if self.code is not None and self.message is not None else []
        return [*first, *self.more]


@dataclass(frozen=True)
class HelpAsk:
    """A script's `--help` still to be read before its preset's resume flag is counted on: what
    to run, where and with which environment."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    flag: str


def ask_resume_flag(spec: RunSpec, environment: Mapping[str, str]) -> FlagCheck | HelpAsk:
    """The answer where none needs the script (no preset would add a flag, or its help cannot
    be run), else the help to read. `HelpAsk.flag` is the resume flag to judge, "" when only the
    flags a retune passes (the accumulation's) are in question."""
    command = spec.command
    preset = PRESETS.get(command.framework) if command is not None else None
    if command is None or preset is None:
        return FlagCheck(spec)
    completed = _preset_applied(spec)
    if completed is None:
        return FlagCheck(spec)
    resume = _adds_flag(spec, completed, preset)
    if not resume and not _added_flag_bindings(spec, completed):
        return FlagCheck(spec)
    argv = help_argv(command.argv)
    why = (
        "the program is known only once it starts" if argv is None else "the command names no working folder"
    )
    if argv is None or command.cwd is None:
        # A flag a retune passes and the script lacks shows as the attempt's own one-line error.
        return _unchecked(spec, preset, f"its `--help` was not run: {why}") if resume else FlagCheck(spec)
    return HelpAsk(argv, help_env(spec, environment), command.cwd, preset.resume_flag if resume else "")


def judge_help(spec: RunSpec, ask: HelpAsk, out: HelpOutput) -> FlagCheck:
    """What the script's help says of the flag: the spec unchanged where it lists the flag (or
    could not be read: then said unchecked), else with the flag turned off and the line why."""
    command = spec.command
    preset = PRESETS.get(command.framework) if command is not None and command.framework else None
    assert command is not None and preset is not None
    shown = shlex.join([Path(ask.argv[0]).name, *ask.argv[1:]])
    if out.text is None:
        return _unchecked(spec, preset, f"`{shown}` {out.problem}") if ask.flag else FlagCheck(spec)
    dropped, more = _missing_bound_flags(spec, out.text, shown)
    if (mismatch := _other_preset(command.framework, out.text, shown)) is not None:
        more = (mismatch, *more)
    checked = spec
    for name in dropped:
        checked = without_role(checked, name)
    if not ask.flag or lists_flag(out.text, preset.resume_flag):
        return FlagCheck(checked, dropped=dropped, more=more)
    assert checked.command is not None
    off = checked.command.model_copy(update={"resume_flag": False})
    flag = preset.resume_flag
    message = (
        f"`{shown}` does not list {flag}, so the {command.framework} preset passes no checkpoint and a "
        f"restart starts from the beginning — load it with sdk.resume_from() in the script "
        f"({preset.sdk_resume}), or give the script a {flag} flag"
    )
    return FlagCheck(checked.model_copy(update={"command": off}), MISSING_CODE, message, dropped, more)


# A flag only one of two kinds of script has, both with the Trainer's batch flags: the Trainer's
# TrainingArguments list --save_steps; the *_no_trainer.py loops on Accelerate take
# --checkpointing_steps instead, and write checkpoints the other preset never looks for.
_SIGNATURE_FLAGS = {"transformers": "--save_steps", "accelerate": "--checkpointing_steps"}
_KINDS = {"transformers": "a Trainer script does", "accelerate": "a loop of its own on Accelerate does"}
_LOOKS_FOR = {
    "transformers": "the Trainer's checkpoint-N folders",
    "accelerate": "accelerator.save_state's step_N folders",
}


def _other_preset(framework: str, text: str, shown: str) -> tuple[str, str] | None:
    """The line for a script whose help reads as the other preset's kind, or None."""
    own = _SIGNATURE_FLAGS.get(framework)
    if own is None or lists_flag(text, own):
        return None
    for other, flag in _SIGNATURE_FLAGS.items():
        if other != framework and lists_flag(text, flag):
            return MISMATCH_CODE, (
                f"`{shown}` lists {flag} but not {own}, as {_KINDS[other]}: the {framework} preset looks "
                f"for {_LOOKS_FOR[framework]} and a restart would start from the beginning — submit "
                f"with --framework {other}"
            )
    return None


def _missing_bound_flags(
    spec: RunSpec, text: str, shown: str
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The knobs passed as a flag (only once a retune changes them) that the help does not list,
    and the line for each."""
    assert spec.command is not None
    roles = {name: role for role, name in spec.command.roles.knob_names().items()}
    dropped: list[str] = []
    lines: list[tuple[str, str]] = []
    for name, binding in spec.command.bind.items():
        if binding.flag is None or name not in roles or lists_flag(text, binding.flag):
            continue
        dropped.append(name)
        role = roles.get(name, "")
        if role != "eval_batch":  # a script that does not evaluate has no such flag, and needs none
            lines.append((FLAG_MISSING_CODE, _flag_missing_line(shown, binding.flag, role)))
    return tuple(dropped), tuple(lines)


def _flag_missing_line(shown: str, flag: str, role: str) -> str:
    if role == "accum_steps":
        return (
            f"`{shown}` does not list {flag}, so a retune cannot keep the effective batch with a smaller "
            f"micro-batch and tries the policy's other steps — give the script a {flag} flag, or name "
            "the one it has: --role accum_steps=NAME"
        )
    return f"`{shown}` does not list {flag}, so a retune does not pass it — give the script a {flag} flag"


def without_role(spec: RunSpec, name: str) -> RunSpec:
    """The spec with no role naming knob `name`: a retune leaves it at its default, so its flag
    is never passed. Its binding stays, so completing the spec again (an edit) adds no other."""
    command = spec.command
    assert command is not None
    roles = command.roles.model_copy(
        update={role: None for role, knob in command.roles.knob_names().items() if knob == name}
    )
    return spec.model_copy(update={"command": command.model_copy(update={"roles": roles})})


def _preset_applied(spec: RunSpec) -> RunSpec | None:
    """The spec as completing it would make it (its config file read once), or None when that
    refuses it: completion then says why in one line of its own."""
    command = spec.command
    assert command is not None
    try:
        config = load_config(command.config_file) if command.config_file is not None else None
        return apply_preset(spec, config)
    except UserError:
        return None


def _added_flag_bindings(spec: RunSpec, completed: RunSpec) -> list[str]:
    """The flag bindings completing the spec adds (a preset's accumulation)."""
    assert spec.command is not None and completed.command is not None
    return [n for n, b in completed.command.bind.items() if b.flag is not None and n not in spec.command.bind]


def check_resume_flag(
    spec: RunSpec,
    environment: Mapping[str, str],
    runner: HelpRunner | None = None,
    timeout_s: float = HELP_TIMEOUT_S,
) -> FlagCheck:
    """Ask the script's help before a preset adds its resume flag; the spec unchanged when no
    preset would add one (no preset, the user's own placeholder, an args file's key)."""
    ask = ask_resume_flag(spec, environment)
    if isinstance(ask, FlagCheck):
        return ask
    return judge_help(spec, ask, (runner or run_help)(ask.argv, ask.env, ask.cwd, timeout_s))


def without_flag(spec: RunSpec, flag: str) -> RunSpec:
    """A completed spec with its preset's resume flag taken back out (the pair it appended, the
    last in argv) and turned off, so no later completion adds it again."""
    command = spec.command
    assert command is not None
    argv = list(command.argv)
    for i in range(len(argv) - 2, -1, -1):
        if argv[i] == flag and argv[i + 1] == "{resume_from?}":
            del argv[i : i + 2]
            break
    off = command.model_copy(update={"resume_flag": False, "argv": argv})
    return spec.model_copy(update={"command": off})


def _adds_flag(spec: RunSpec, completed: RunSpec, preset: Preset) -> bool:
    """Whether completing the spec appends the preset's resume flag to its argv."""
    assert spec.command is not None and completed.command is not None
    if not spec.command.resume_flag:
        return False
    flag = preset.resume_flag
    return completed.command.argv.count(flag) > spec.command.argv.count(flag)


def _unchecked(spec: RunSpec, preset: Preset, why: str) -> FlagCheck:
    assert spec.command is not None
    flag = preset.resume_flag
    message = (
        f"{flag} {{resume_from?}} is added unchecked: {why} — if the script has no {flag} flag, a "
        f"restart fails on it; give the script one, or set command.resume_flag: false and load "
        f"sdk.resume_from() in the script ({preset.sdk_resume})"
    )
    return FlagCheck(spec, UNCHECKED_CODE, message)


def lists_flag(text: str, flag: str) -> bool:
    """Whether a help text names `flag` as itself (`--ckpt_path`, not `--ckpt_path_other`)."""
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def help_argv(argv: list[str]) -> list[str] | None:
    """The command's program (interpreter, script or `-m module`, and the words after it that
    are no flag, as LightningCLI's `fit`, whose help lists the flags `fit` takes) with `--help`;
    None when the program's path is a placeholder only an attempt fills in."""
    items = [sys.executable if item == "{python}" else item for item in argv]
    script = next((i for i, item in enumerate(items) if item.endswith(".py")), None)
    if script is None and "-m" in items[:-1]:
        script = items.index("-m") + 1
    end = (script or 0) + 1
    while end < len(items) and not items[end].startswith("-") and "{" not in items[end]:
        end += 1
    program = items[:end]
    if any("{" in item for item in program):
        return None
    return [*program, "--help"]


def help_env(spec: RunSpec, environment: Mapping[str, str]) -> dict[str, str]:
    """The run's environment for its help: no GPU (a script that ignores `--help` and starts
    training must not take one another run holds), and no gpuwarden variable, so its SDK stays
    silent."""
    assert spec.command is not None
    env = {k: v for k, v in environment.items() if not k.startswith("GPUWARDEN_")}
    env.update(spec.env)
    env.update({k: v for k, v in spec.command.env.items() if "{" not in v})
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_help(argv: list[str], env: Mapping[str, str], cwd: Path, timeout_s: float) -> HelpOutput:
    """Run `argv` (no shell) in a session of its own and read at most HELP_OUTPUT_LIMIT bytes of
    its output; whatever it started is killed with it when it is done or out of time."""
    try:
        proc = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        return HelpOutput(None, f"could not start: {exc.strerror or exc}")
    # The help is wanted only at a restart, while the attempt it runs beside is starting now: on
    # a machine with few cores it takes what is left over (set from here, as a `preexec_fn` is
    # unsafe in the daemon's threads; the interpreter has not begun its imports yet).
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, proc.pid, 19)
    deadline = time.monotonic() + timeout_s
    try:
        assert proc.stdout is not None
        data, ended = _read_bounded(proc.stdout.fileno(), deadline)
        code = proc.wait(timeout=max(0.0, deadline - time.monotonic())) if ended == "eof" else None
    except subprocess.TimeoutExpired:
        ended, code = "deadline", None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    if ended == "deadline":
        return HelpOutput(None, f"did not finish within {timeout_s:.0f} s")
    if ended == "limit":
        return HelpOutput(None, f"printed more than {HELP_OUTPUT_LIMIT // 1024} KiB")
    if code != 0:
        return HelpOutput(None, f"exited with status {code}")
    return HelpOutput(data.decode("utf-8", "replace"))


def _read_bounded(fd: int, deadline: float) -> tuple[bytes, str]:
    """What the pipe gives until its end ("eof"), the deadline, or the output limit ("limit")."""
    data = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while len(data) <= HELP_OUTPUT_LIMIT:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                return bytes(data), "deadline"
            chunk = os.read(fd, 65536)
            if not chunk:
                return bytes(data), "eof"
            data += chunk
    return bytes(data), "limit"
