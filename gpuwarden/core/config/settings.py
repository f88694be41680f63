"""Daemon settings: `~/.config/gpuwarden/config.yaml`, then GPUWARDEN_* variables, then flags.

Each layer overrides the one before key by key. Errors name the layer that supplied the bad
value: `config.yaml:4: sample_interval: …`, `GPUWARDEN_SAMPLE_INTERVAL: …`, `--sample-interval: …`.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from gpuwarden.core.config.hosts import HostName, SshSettings
from gpuwarden.core.config.validation import StrictModel, refuse_foreign, validate
from gpuwarden.core.config.yamlsource import KeyPath, YamlDocument, load_yaml_file
from gpuwarden.core.errors import UserError
from gpuwarden.core.paths import Paths, default_config_file, default_runtime_dir, default_state_dir

ENV_PREFIX = "GPUWARDEN_"
# GPUWARDEN_* variables that are not settings (so not rejected as unknown): the client's, and
# what the daemon gives each process of a run, so that `gpuwarden` works inside a run too.
ENV_RESERVED = {
    "GPUWARDEN_CONFIG",
    "GPUWARDEN_FAKE_NVML",
    "GPUWARDEN_SOCKET",
    "GPUWARDEN_RUN_TAG",
    "GPUWARDEN_EVENTS_FILE",
    "GPUWARDEN_RUN_ID",
    "GPUWARDEN_ATTEMPT",
    "GPUWARDEN_RESUME_FROM",
    # what `notify.on_event` commands get (so `gpuwarden` works inside such a hook too)
    *(f"GPUWARDEN_{name}" for name in ("EVENT", "RUN", "RUN_NAME", "HOST", "GPU", "TITLE", "BODY")),
}


class RetentionSettings(StrictModel):
    """How long each tier of samples is kept."""

    raw_hours: float = Field(48.0, gt=0, description="raw samples, hours")
    minute_days: float = Field(30.0, gt=0, description="1-minute rollups, days")
    hour_days: float = Field(365.0, gt=0, description="1-hour rollups, days")
    chunk_rows: int = Field(5000, ge=100, le=1_000_000, description="rows deleted per statement")


class PathSettings(StrictModel):
    """Where state lives; unset means the XDG default."""

    state_dir: Path | None = None
    runtime_dir: Path | None = None
    db: Path | None = None


class MetricsSettings(StrictModel):
    """Prometheus exporter on TCP; off unless enabled (the API itself is only on the Unix socket)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(9401, ge=1, le=65535)
    # Prometheus keeps what it scraped; a run exported for ever would grow every scrape without bound.
    ended_runs_minutes: float = Field(
        60.0, ge=0, le=525_600, description="minutes a run that ended stays on /metrics (0: only live runs)"
    )


# -- notifications (`notify:`) -----------------------------------------------------------------------

NotifyEvent = Literal["succeeded", "failed", "retuned", "restarted", "hung", "idle", "throttled"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = typing.get_args(NotifyEvent)
# An apprise URL starts with its service's scheme: ntfy://, slack://, mailto://, json://, …
_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://\S+$")


class NotifySettings(StrictModel):
    """Where the daemon tells what happens to runs and GPUs: apprise URLs and a command."""

    urls: list[str] = Field(default_factory=list, description="apprise URLs: ntfy://topic, slack://…")
    on_event: list[str] | None = Field(
        None, min_length=1, description="a command (argv, no shell) given each event as JSON on stdin"
    )
    on_event_timeout: float = Field(10.0, gt=0, le=600, description="seconds before the command is killed")
    events: list[NotifyEvent] = Field(default_factory=lambda: list(NOTIFY_EVENTS))
    idle_minutes: float = Field(15.0, ge=0, le=10_080, description="a run's GPU idle this long (0: off)")
    throttle_minutes: float = Field(5.0, ge=0, le=10_080, description="throttled this long (0: off)")
    max_per_run: int = Field(5, ge=1, le=10_000, description="messages per run per `per_minutes`")
    per_minutes: float = Field(10.0, gt=0, le=10_080, description="the rate limit's window")
    send_timeout: float = Field(10.0, gt=0, le=600, description="seconds one try of one send may take")
    retries: int = Field(3, ge=0, le=20, description="tries after the first, backing off 1, 2, 4… s")

    @field_validator("urls")
    @classmethod
    def _apprise_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not _URL_SCHEME.match(url):
                shown = url if len(url) <= 24 else f"{url[:8]}… ({len(url)} characters)"
                raise ValueError(
                    f"{shown!r} is not an apprise URL — write it as SERVICE://…, e.g. "
                    "'ntfy://my-topic' or 'json://localhost:8080/hook'"
                )
        return urls

    @field_validator("on_event")
    @classmethod
    def _argv(cls, argv: list[str] | None) -> list[str] | None:
        if argv is not None and not argv[0].strip():
            raise ValueError("the command's first item must name a program")
        return argv

    @property
    def configured(self) -> bool:
        """Whether anything is to be sent (else the daemon loads none of it)."""
        return bool(self.urls or self.on_event)


class Settings(StrictModel):
    """Everything the daemon and `gpuwarden monitor` need to know."""

    sample_interval: float = Field(1.0, ge=0.05, le=3600, description="seconds between samples")
    process_interval: float = Field(5.0, ge=0.5, le=3600, description="seconds between process/PCIe reads")
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    paths: PathSettings = Field(default_factory=PathSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    notify: NotifySettings = Field(default_factory=NotifySettings)
    stop_grace_seconds: float = Field(30.0, ge=0, le=3600, description="SIGTERM → SIGKILL grace")
    max_runs_per_gpu: int = Field(1, ge=1, le=64)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    power_limit_command: str | None = Field(
        None,
        description="a command that sets a GPU's power limit for `tune --power-sweep` without root, "
        "with {index}, {uuid} and {watts} filled in, e.g. 'sudo -n nvidia-smi -i {index} -pl {watts}'",
    )

    hosts: list[HostName] = Field(
        default_factory=list, description="machines `--all-hosts` reads, as ssh takes them; `local`: this one"
    )
    ssh: SshSettings = Field(default_factory=SshSettings)

    def resolve_paths(self) -> Paths:
        state = (self.paths.state_dir or default_state_dir()).expanduser()
        runtime = (self.paths.runtime_dir or default_runtime_dir()).expanduser()
        db = (self.paths.db or state / "gpuwarden.db").expanduser()
        return Paths(state_dir=state, runtime_dir=runtime, db=db)


def _set_path(target: dict[str, Any], path: KeyPath, value: Any) -> None:
    node = target
    for part in path[:-1]:
        child = node.get(str(part))
        if not isinstance(child, dict):
            child = {}
            node[str(part)] = child
        node = child
    node[str(path[-1])] = value


def _leaf_paths(model: type[StrictModel], prefix: KeyPath = ()) -> dict[str, KeyPath]:
    """ENV-style names (SAMPLE_INTERVAL, RETENTION__RAW_HOURS) for every settings leaf."""
    out: dict[str, KeyPath] = {}
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, StrictModel):
            out.update(_leaf_paths(ann, (*prefix, name)))
        else:
            out["__".join(str(p) for p in (*prefix, name)).upper()] = (*prefix, name)
    return out


def env_layer(environ: Mapping[str, str]) -> dict[KeyPath, tuple[str, str]]:
    """GPUWARDEN_* variables as {key path: (variable name, value)}; unknown names are errors."""
    leaves = _leaf_paths(Settings)
    out: dict[KeyPath, tuple[str, str]] = {}
    for var, value in environ.items():
        if not var.startswith(ENV_PREFIX) or var in ENV_RESERVED:
            continue
        name = var[len(ENV_PREFIX) :]
        if name not in leaves:
            close = difflib.get_close_matches(name, list(leaves), n=1)
            hint = f"did you mean {ENV_PREFIX}{close[0]}?" if close else "unset it"
            raise UserError(f"environment variable {var}: not a gpuwarden setting — {hint}")
        out[leaves[name]] = (var, value)
    return out


def _env_value(path: KeyPath, var: str, value: str) -> Any:
    """A variable's text, or for a list setting (`notify.urls`) the JSON list it holds."""
    model: Any = Settings
    for part in path[:-1]:
        model = model.model_fields[str(part)].annotation
    annotation = model.model_fields[str(path[-1])].annotation
    if list not in (typing.get_origin(annotation), *map(typing.get_origin, typing.get_args(annotation))):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise UserError(
            f"environment variable {var}: must be a JSON list, e.g. {var}='[\"ntfy://my-topic\"]'"
        ) from None


def _anchor_relative_paths(data: dict[str, Any], origin: Mapping[KeyPath, str], config_dir: Path) -> None:
    """Relative `paths.*` values start from the config file's folder when the file gave them, and
    from the current folder when a variable or flag did: never from wherever the daemon happens
    to be started later."""
    section = data.get("paths")
    if not isinstance(section, dict):
        return
    for key, value in section.items():
        if not isinstance(value, str | Path) or not str(value) or str(value).startswith("~"):
            continue
        given = Path(value)
        if given.is_absolute():
            continue
        from_file = ("paths", key) not in origin and ("paths",) not in origin
        section[key] = str((config_dir if from_file else Path.cwd()) / given)


def load_settings(
    config_file: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge file → environment → flags and validate. `flags` keys are dotted ("retention.raw_hours")."""
    environ = os.environ if environ is None else environ
    path = config_file or default_config_file()
    explicit = config_file is not None or "GPUWARDEN_CONFIG" in environ
    # A missing default file is fine (defaults apply); a file the user named must exist, and so
    # must the target of a link left in the default place (a dotfiles link whose target moved).
    present = path.exists() or path.is_symlink() or explicit
    doc = load_yaml_file(path) if present else YamlDocument(data={}, label=str(path))

    # Judged before the environment's keys join it: they would make any file look like a config.
    refuse_foreign(Settings, doc.data, doc.where)
    data: dict[str, Any] = dict(doc.data)
    origin: dict[KeyPath, str] = {}
    for key_path, (var, value) in env_layer(environ).items():
        _set_path(data, key_path, _env_value(key_path, var, value))
        origin[key_path] = f"environment variable {var}"
    for dotted, value in (flags or {}).items():
        if value is None:
            continue
        key_path = tuple(dotted.split("."))
        _set_path(data, key_path, value)
        origin[key_path] = "--" + dotted.replace("_", "-").replace(".", "-")

    _anchor_relative_paths(data, origin, path.absolute().parent)

    def where(loc: KeyPath) -> str:
        for n in range(len(loc), 0, -1):
            if tuple(loc[:n]) in origin:
                return origin[tuple(loc[:n])]
        return doc.where(loc)

    return validate(Settings, data, where)
