"""Framework presets: what gpuwarden knows about Hugging Face Trainer, Accelerate and Lightning programs.

A preset reads the program's argv (and its config file, for a program that takes its arguments
from a JSON/YAML file) for the settings it knows by name, and turns each into a knob with its
role: `--per_device_train_batch_size 8` becomes `--per_device_train_batch_size {per_device_train_batch_size}`
with the knob's value 8 and the role micro_batch. It also adds what a restart needs: the
accumulation flag when the program did not pass one (so the effective batch can be kept), the
resume flag with an optional `{resume_from?}` (unless `command.resume_flag` is false: the script
does not take it, see help_check.py), and where the framework writes its checkpoints.
The Trainer's `--bf16`/`--fp16` switches (flags or args-file keys) become one `precision` knob.
Nothing the user set in the spec is overridden: a placeholder or binding of theirs stays, and a
value under `knobs:` wins over the flag's text (that is how a tuned spec takes effect).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.core.command.composed_configs import earlier_configs
from gpuwarden.core.command.config_file import ConfigDocument
from gpuwarden.core.config.argv_flags import (
    OWN_KNOB_RE,
    flag_setting,
    knob_for,
    override_setting,
    setting_name,
)
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.config.spec_command import Checkpoints, CommandSpec, KnobBinding
from gpuwarden.core.errors import UserError


@dataclass(frozen=True)
class Preset:
    """One framework's names. `names` maps a flag or key name to (knob name, role)."""

    names: dict[str, tuple[str, str]]
    accum_flag: str  # added when the program passes a micro-batch but no accumulation
    accum_knob: str
    resume_flag: str  # added with {resume_from?} when argv has no resume placeholder
    resume_key: str  # the config-file key that takes the checkpoint, for args files
    checkpoint_glob: str  # relative to the working directory; {output} is the output_dir knob
    checkpoint_glob_default: str  # when there is no output_dir knob
    complete_when: str | None
    bools: frozenset[str] = field(default_factory=frozenset)
    # Switches that together say the precision (flag or key name → the precision it turns on);
    # they become one `precision` knob with the precision role.
    precision_switches: dict[str, str] = field(default_factory=dict)
    sdk_resume: str = ""  # how a script without the resume flag loads the checkpoint instead


TRANSFORMERS = Preset(
    names={
        "per_device_train_batch_size": ("per_device_train_batch_size", "micro_batch"),
        "per_device_eval_batch_size": ("per_device_eval_batch_size", "eval_batch"),
        "gradient_accumulation_steps": ("gradient_accumulation_steps", "accum_steps"),
        "gradient_checkpointing": ("gradient_checkpointing", "gradient_checkpointing"),
        "max_steps": ("max_steps", "max_steps"),
        "output_dir": ("output_dir", "output_dir"),
    },
    accum_flag="--gradient_accumulation_steps",
    accum_knob="gradient_accumulation_steps",
    resume_flag="--resume_from_checkpoint",
    resume_key="resume_from_checkpoint",
    checkpoint_glob="{output}/checkpoint-*",
    checkpoint_glob_default="trainer_output/checkpoint-*",
    # The Trainer writes trainer_state.json after the weights and the optimizer state.
    complete_when="trainer_state.json",
    bools=frozenset({"gradient_checkpointing"}),
    precision_switches={"bf16": "bf16", "fp16": "fp16"},
    sdk_resume="trainer.train(resume_from_checkpoint=sdk.resume_from())",
)

LIGHTNING = Preset(
    names={
        "batch_size": ("batch_size", "micro_batch"),
        "data.batch_size": ("batch_size", "micro_batch"),
        "data.init_args.batch_size": ("batch_size", "micro_batch"),
        "accumulate_grad_batches": ("accumulate_grad_batches", "accum_steps"),
        "trainer.accumulate_grad_batches": ("accumulate_grad_batches", "accum_steps"),
        "max_steps": ("max_steps", "max_steps"),
        "trainer.max_steps": ("max_steps", "max_steps"),
        "default_root_dir": ("default_root_dir", "output_dir"),
        "trainer.default_root_dir": ("default_root_dir", "output_dir"),
    },
    accum_flag="--accumulate_grad_batches",
    accum_knob="accumulate_grad_batches",
    resume_flag="--ckpt_path",
    resume_key="ckpt_path",
    checkpoint_glob="{output}/**/*.ckpt",
    checkpoint_glob_default="lightning_logs/**/*.ckpt",
    complete_when=None,
    sdk_resume="trainer.fit(model, ckpt_path=sdk.resume_from())",
)

# A training loop of the user's own on Accelerate, as transformers' `*_no_trainer.py` examples
# write it: the Trainer's flag names, but `accelerator.save_state` folders (`step_12`, `epoch_0`)
# and a `--resume_from_checkpoint` that the script hands to `accelerator.load_state`.
ACCELERATE = Preset(
    names={
        "per_device_train_batch_size": ("per_device_train_batch_size", "micro_batch"),
        "per_device_eval_batch_size": ("per_device_eval_batch_size", "eval_batch"),
        "gradient_accumulation_steps": ("gradient_accumulation_steps", "accum_steps"),
        "max_train_steps": ("max_train_steps", "max_steps"),
        "output_dir": ("output_dir", "output_dir"),
    },
    accum_flag="--gradient_accumulation_steps",
    accum_knob="gradient_accumulation_steps",
    resume_flag="--resume_from_checkpoint",
    resume_key="resume_from_checkpoint",
    checkpoint_glob="{output}/*_[0-9]*",
    checkpoint_glob_default="*_[0-9]*",
    # save_state writes the weights, optimizer, scheduler and samplers, then each process's random
    # states; the main process's file last of what it writes itself.
    complete_when="random_states_0.pkl",
)

PRESETS: dict[str, Preset] = {"transformers": TRANSFORMERS, "lightning": LIGHTNING, "accelerate": ACCELERATE}


# A value that is one placeholder alone (`{bs}`, `{precision=bf16}`) is a knob already in place;
# `{run_dir}/out` is text.
PRECISION_KNOB = "precision"
_TRUE_TEXT = ("true", "1", "yes")


def parse_value(text: str) -> int | float | bool | str:
    """A flag's text as the value a knob keeps: 8 → 8, true → True, 1e-4 → 0.0001."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        # `nan`, `inf` or `1e400` stay the text they are: a knob is a finite number or a word.
        return number if math.isfinite(number) else text
    return text


@dataclass
class _Draft:
    argv: list[str]
    knobs: dict[str, Any]
    bind: dict[str, KnobBinding]
    roles: dict[str, Any]
    claimed: set[str] = field(default_factory=set)  # knobs this preset has put in place
    from_flags: set[str] = field(default_factory=set)  # of those, the ones made of a flag's text
    overrides: bool = False  # the settings came as Hydra overrides (`data.batch_size=64`), not flags
    given: set[str] = field(init=False)  # the user's own values: no flag's text replaces them

    def __post_init__(self) -> None:
        self.given = set(self.knobs)


def _claim(draft: _Draft, preset: Preset, name: str, value: Any) -> str | None:
    """Record a recognised setting as a knob with its role; the knob name, or None when the
    user's spec already decides where it goes. A value the user gave under `knobs:` wins over
    the text of the flag or key (so a tuned spec's knobs take effect)."""
    knob, role = preset.names[name]
    if knob in draft.bind:
        return None
    if knob in draft.from_flags:
        _again(draft, knob, value)
        return knob
    if knob in draft.claimed:
        return None
    draft.knobs.setdefault(knob, value)
    draft.roles.setdefault(role, knob)
    draft.claimed.add(knob)
    draft.from_flags.add(knob)
    return knob


def _again(draft: _Draft, knob: str, value: Any) -> None:
    """A setting the command passes twice: the program takes the last one (argparse does), so
    every occurrence is the knob and the last one's text its value."""
    if knob not in draft.given:
        draft.knobs[knob] = value


def _scan_argv(draft: _Draft, preset: Preset) -> None:
    out: list[str] = []
    items = draft.argv
    i = 0
    while i < len(items):
        item = items[i]
        parsed = flag_setting(item)
        if parsed is None and i > 0 and _scan_override(draft, preset, item, out):
            i += 1
            continue
        if parsed is None or parsed[0] not in preset.names:
            out.append(item)
            i += 1
            continue
        name, inline = parsed
        knob_name = preset.names[name][0]
        has_next = i + 1 < len(items) and not items[i + 1].startswith("--")
        if has_next and OWN_KNOB_RE.fullmatch(items[i + 1]):
            out += [item, items[i + 1]]  # the user's own knob, or one put in place before
            draft.claimed.add(items[i + 1].strip("{}?"))
            i += 2
        elif inline is not None:
            knob = _claim(draft, preset, name, parse_value(inline))
            out.append(f"--{item[2:].partition('=')[0]}={{{knob}}}" if knob else item)
            i += 1
        elif has_next:
            knob = _claim(draft, preset, name, parse_value(items[i + 1]))
            out += [item, f"{{{knob}}}" if knob else items[i + 1]]
            i += 2
        elif knob_name in preset.bools:
            # `--gradient_checkpointing` alone means true; HfArgumentParser also takes a value.
            knob = _claim(draft, preset, name, True)
            out += [item, f"{{{knob}}}"] if knob else [item]
            i += 1
        else:
            out.append(item)
            i += 1
    draft.argv = out


def _scan_override(draft: _Draft, preset: Preset, item: str, out: list[str]) -> bool:
    """A Hydra override of a key the preset knows (`data.batch_size=64`, as a Lightning project
    configured by Hydra takes it) becomes its knob in place; whether `item` was one."""
    override = override_setting(item)
    if override is None or override[1] not in preset.names:
        return False
    prefix, key, value = override
    knob = _claim(draft, preset, key, parse_value(value))
    out.append(f"{prefix}{key}={{{knob}}}" if knob else item)
    draft.overrides = True
    return True


def _lift_role_flags(draft: _Draft) -> None:
    """`--role max_length=max_seq_length` with `--max_seq_length 512` in the command: a flag the
    preset does not know, named by the user's role, becomes that knob as a known one would (a
    role may name it as the command writes it: `--max-seq-length`). So does an override
    (`training.batch_size=64`, Hydra's way); a dotted setting's knob is its last part."""
    wanted = {
        setting_name(t)
        for t in draft.roles.values()
        if isinstance(t, str) and t not in draft.knobs and t not in draft.bind
    }
    lifted: dict[str, str] = {}  # setting → knob
    for i in range(len(draft.argv)):
        found = _role_setting(draft.argv, i)
        if found is None or found[0] not in wanted:
            continue
        setting, text, index, head = found
        knob = lifted.get(setting) or knob_for(setting, set(draft.knobs))
        draft.argv[index] = f"{head}{{{knob}}}"
        draft.knobs[knob] = parse_value(text)  # passed twice: the program takes the last one
        lifted[setting] = knob
    for role, target in list(draft.roles.items()):
        if isinstance(target, str) and setting_name(target) in lifted:
            draft.roles[role] = lifted[setting_name(target)]


def _role_setting(items: list[str], i: int) -> tuple[str, str, int, str] | None:
    """(setting, its value's text, the item its knob goes into, the text before the knob there)
    of the flag or override at `items[i]`; None for anything else, or a flag with no value."""
    item = items[i]
    parsed = flag_setting(item)
    if parsed is not None:
        name, inline = parsed
        if inline is not None:
            return name, inline, i, f"{item.partition('=')[0]}="
        if i + 1 < len(items) and not items[i + 1].startswith("--"):
            return name, items[i + 1], i + 1, ""
        return None
    override = override_setting(item) if i > 0 else None
    if override is None:
        return None
    prefix, key, value = override
    return key, value, i, f"{prefix}{key}="


def _lift_plain(spec: RunSpec) -> RunSpec:
    """A program no preset knows: only the flags its roles name become knobs (`--role
    micro_batch=batch-size` with `--batch-size 64` in the command)."""
    command = spec.command
    assert command is not None
    roles = {k: v for k, v in command.roles.model_dump().items() if v is not None}
    draft = _Draft(list(command.argv), dict(spec.knobs), dict(command.bind), roles)
    _lift_role_flags(draft)
    if draft.argv == list(command.argv):
        return spec
    lifted = CommandSpec.model_validate({**command.model_dump(), "argv": draft.argv, "roles": draft.roles})
    return spec.model_copy(update={"command": lifted, "knobs": draft.knobs})


def _switch_on(text: Any) -> bool:
    return text is True or (isinstance(text, str) and text.strip().lower() in _TRUE_TEXT)


def _precision_of(draft: _Draft, on: list[str], where: str) -> str:
    """The precision the switches say (fp32 when none is on); a value under `knobs:` wins."""
    if len(on) > 1:
        raise UserError(f"{where}: {' and '.join(on)} are both on — a run has one precision; keep one")
    return str(draft.knobs.get(PRECISION_KNOB, on[0] if on else "fp32"))


def _scan_precision_argv(draft: _Draft, preset: Preset) -> None:
    """`--bf16`, `--fp16 true`, `--bf16=false` … become one precision knob: the argv passes
    every switch as `--bf16 {precision=bf16}`, so a retune can move from one to another."""
    switches = preset.precision_switches
    if not switches or PRECISION_KNOB in draft.bind or PRECISION_KNOB in draft.claimed:
        return
    out: list[str] = []
    on: list[str] = []
    at: int | None = None
    items = draft.argv
    i = 0
    while i < len(items):
        parsed = flag_setting(items[i])
        has_next = i + 1 < len(items) and not items[i + 1].startswith("--")
        if parsed is None or parsed[0] not in switches:
            out.append(items[i])
            i += 1
            continue
        name, inline = parsed
        if has_next and OWN_KNOB_RE.fullmatch(items[i + 1]):
            return  # already in place (a completed spec), or the user's own placeholder
        if inline is not None:
            value: Any = inline
        elif has_next and items[i + 1].strip().lower() in (*_TRUE_TEXT, "false", "0", "no"):
            value, i = items[i + 1], i + 1
        else:
            value = True  # the flag alone means true
        if _switch_on(value):
            on.append(switches[name])
        at = len(out) if at is None else at
        i += 1
    if at is None:
        return
    precision = _precision_of(draft, on, "command.argv")
    placed = [x for flag, p in switches.items() for x in (f"--{flag}", f"{{{PRECISION_KNOB}={p}}}")]
    draft.argv = out[:at] + placed + out[at:]
    _set_precision(draft, precision)


def _scan_precision_config(draft: _Draft, preset: Preset, config: ConfigDocument) -> None:
    """`bf16: true` in an args file: the precision knob, bound to the switches of the copy."""
    switches = preset.precision_switches
    if not switches or PRECISION_KNOB in draft.bind or PRECISION_KNOB in draft.claimed:
        return
    present: dict[str, Any] = {}
    for key in switches:
        try:
            present[key] = config.get(key)
        except KeyError:
            continue
    if not present:
        return
    on = [switches[k] for k, v in present.items() if _switch_on(v)]
    precision = _precision_of(draft, on, str(config.path))
    draft.bind[PRECISION_KNOB] = KnobBinding(flags=dict(switches), default="fp32")
    _set_precision(draft, precision)


def _set_precision(draft: _Draft, precision: str) -> None:
    draft.knobs[PRECISION_KNOB] = precision
    draft.roles.setdefault("precision", PRECISION_KNOB)
    draft.claimed.add(PRECISION_KNOB)


def _scan_config(draft: _Draft, preset: Preset, config: ConfigDocument, earlier: bool = False) -> None:
    """Known keys of the run's config file become knobs bound to them; of a file LightningCLI
    reads before it (`earlier`), bound to the same key with the value found there, which the
    run's copy takes when a retune changes it."""
    for name, (knob, _) in preset.names.items():
        if knob in draft.claimed or knob in draft.bind:
            continue
        try:
            value = config.get(name)
        except KeyError:
            continue
        if isinstance(value, bool | int | float | str) and _claim(draft, preset, name, value):
            draft.bind[knob] = KnobBinding(config=name, default=value if earlier else None)


def _scan_configs(draft: _Draft, preset: Preset, config: ConfigDocument, cwd: Path) -> None:
    """The run's config file, then (LightningCLI) the files composed before it, last first."""
    _scan_config(draft, preset, config)
    if preset is not LIGHTNING:
        return
    earlier = earlier_configs(draft.argv, cwd, config.path)
    for document in reversed(earlier):
        _scan_config(draft, preset, document, earlier=True)
    if any(isinstance(_get(d, "trainer"), dict) for d in [config, *earlier]):
        _bind_max_steps(draft)


def _get(config: ConfigDocument, key: str) -> Any:
    try:
        return config.get(key)
    except KeyError:
        return None


def _bind_max_steps(draft: _Draft) -> None:
    """A LightningCLI config without `trainer.max_steps` trains by epochs; the key is still the
    Trainer's, so a probe can set it to stop after a few steps (`tune`)."""
    if "max_steps" in draft.roles or "max_steps" in draft.claimed or "max_steps" in draft.bind:
        return
    draft.knobs.setdefault("max_steps", -1)
    draft.roles["max_steps"] = "max_steps"
    draft.bind["max_steps"] = KnobBinding(config="trainer.max_steps", default=-1)
    draft.claimed.add("max_steps")


def _add_accumulation(draft: _Draft, preset: Preset, from_config: bool, user_roles: set[str]) -> None:
    """Only where the preset found the micro-batch itself: a user who named the role knows
    whether the program takes an accumulation setting."""
    if "micro_batch" not in draft.roles or "micro_batch" in user_roles or "accum_steps" in draft.roles:
        return
    knob = preset.accum_knob
    if knob in draft.claimed or knob in draft.bind:
        return
    draft.knobs.setdefault(knob, 1)  # a value under `knobs:` (a tuned spec's) wins
    draft.roles["accum_steps"] = knob
    draft.claimed.add(knob)
    if from_config:
        key = "trainer.accumulate_grad_batches" if preset is LIGHTNING else knob
        draft.bind[knob] = KnobBinding(config=key, default=1)
    else:
        flag = preset.accum_flag
        if preset is LIGHTNING and draft.overrides:
            # Added or overridden, whether or not the project's trainer config names the key.
            draft.argv.append(f"++trainer.accumulate_grad_batches={{{knob}}}")
            return
        if preset is LIGHTNING and any(a.startswith("--trainer.") for a in draft.argv):
            flag = "--trainer.accumulate_grad_batches"
        # Passed only once a retune sets it: at 1 it changes nothing, and a script that has no
        # such flag still runs (help_check finds out before a retune counts on it).
        draft.bind[knob] = KnobBinding(flag=flag, default=1)


# The Trainer's evaluation batch when the command does not set it (TrainingArguments' default).
TRAINER_EVAL_BATCH = 8


def _add_eval_batch(draft: _Draft, preset: Preset, from_config: bool, user_roles: set[str]) -> None:
    """The Trainer evaluates with a batch of its own: where the command leaves it at the default,
    a knob holds that default, passed only once a retune lowers it after an out-of-memory in
    evaluation (a script whose help lacks the flag has the knob dropped, as the accumulation's)."""
    knob = "per_device_eval_batch_size"
    if preset is not TRANSFORMERS or "micro_batch" not in draft.roles or "micro_batch" in user_roles:
        return
    if "eval_batch" in draft.roles or knob in draft.claimed or knob in draft.bind:
        return
    draft.knobs.setdefault(knob, TRAINER_EVAL_BATCH)
    draft.roles["eval_batch"] = knob
    draft.claimed.add(knob)
    where = {"config": knob} if from_config else {"flag": f"--{knob}"}
    draft.bind[knob] = KnobBinding(**where, default=TRAINER_EVAL_BATCH)


def apply_preset(spec: RunSpec, config: ConfigDocument | None) -> RunSpec:
    """The spec with the framework's settings turned into knobs and roles (no-op for `none`)."""
    command = spec.command
    if command is None:
        return spec
    if command.framework not in PRESETS:
        return _lift_plain(spec)
    preset = PRESETS[command.framework]
    draft = _Draft(
        list(command.argv),
        dict(spec.knobs),
        dict(command.bind),
        {k: v for k, v in command.roles.model_dump().items() if v is not None},
    )
    user_roles = set(draft.roles)
    _scan_argv(draft, preset)
    _lift_role_flags(draft)
    _scan_precision_argv(draft, preset)
    from_config = config is not None and "micro_batch" not in draft.roles
    if config is not None:
        _scan_configs(draft, preset, config, command.cwd or config.path.parent)
        _scan_precision_config(draft, preset, config)
    _add_accumulation(draft, preset, from_config and "micro_batch" in draft.roles, user_roles)
    _add_eval_batch(draft, preset, from_config and "micro_batch" in draft.roles, user_roles)
    checkpoints = command.checkpoints
    # A completed spec already passes the checkpoint: in argv, or through the args file's key.
    resumable = any("{resume_from" in a for a in draft.argv) or bool(checkpoints and checkpoints.config_key)
    if checkpoints is None:
        out_knob = draft.roles.get("output_dir")
        pattern = (
            preset.checkpoint_glob.replace("{output}", f"{{{out_knob}}}")
            if isinstance(out_knob, str)
            else preset.checkpoint_glob_default
        )
        checkpoints = Checkpoints(glob=pattern, complete_when=preset.complete_when)
    if not resumable:
        if config is not None and from_config:
            if checkpoints.config_key is None:
                checkpoints = checkpoints.model_copy(update={"config_key": preset.resume_key})
        elif preset is LIGHTNING and draft.overrides:
            # Quoted: Lightning's checkpoint names hold '=', which Hydra's grammar takes otherwise.
            draft.argv.append(f"++{preset.resume_key}='{{resume_from?}}'")
        elif command.resume_flag:  # false: the script does not take the flag (help_check)
            draft.argv += [preset.resume_flag, "{resume_from?}"]
    new_command = CommandSpec.model_validate(
        {
            **command.model_dump(),
            "argv": draft.argv,
            "bind": {k: b.model_dump(exclude_none=True) for k, b in draft.bind.items()},
            "roles": draft.roles,
            "checkpoints": checkpoints.model_dump(exclude_none=True),
        }
    )
    return spec.model_copy(update={"command": new_command, "knobs": draft.knobs})
