"""`restart:` — restarting a run after a failure that is not out of memory (like torchrun's
`--max-restarts` or systemd's `Restart=on-failure`). Off unless the spec has the section.

```yaml
restart:
  on: [signal, hang, exit_code: [1, 137]]   # killed by a signal; a hung gang; these exit codes
  max: 3                              # restarts over the run's life
  backoff: 10                         # seconds between the failure and the next attempt
```

Out-of-memory failures are the retune policy's, a stop is a person's decision, and exit code 2
means the spec cannot run as written: none of these restart.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gpuwarden.core.config.validation import StrictModel
from gpuwarden.core.events import EXIT_TERMINATED

TRIGGER_HINT = "use `signal`, `hang` or `exit_code: [1, 2]`"


class ExitCodes(StrictModel):
    """Restart when the run exits with one of these codes."""

    exit_code: list[int] = Field(min_length=1, description="exit codes that restart the run (1–255)")


Trigger = Literal["signal", "hang"] | ExitCodes


class RestartPolicy(StrictModel):
    """When and how often a failed run starts again from its last checkpoint."""

    on: list[Trigger] = Field(
        min_length=1,
        description="`signal` (killed by a signal, not by a stop or the OOM killer), `hang` (a "
        "multi-process run the hang watchdog stopped) and/or `exit_code: [..]`",
    )
    max: int = Field(3, ge=1, le=1000, description="restarts over the run's life")
    backoff: float = Field(10.0, ge=0, le=86400, description="seconds before each restart")

    @model_validator(mode="before")
    @classmethod
    def _on_key(cls, data: Any) -> Any:
        # YAML 1.1 reads a bare `on:` key as the boolean true; the key is meant.
        if isinstance(data, dict) and True in data and "on" not in data:
            data = {("on" if k is True else k): v for k, v in data.items()}
        return data

    @field_validator("on", mode="before")
    @classmethod
    def _triggers(cls, v: Any) -> Any:
        # Checked here, whole, so a mistake is one line rather than one per member of the union.
        items = v if isinstance(v, list) else [v]
        if not items:
            raise ValueError(f"no trigger given — {TRIGGER_HINT}")
        out: list[Any] = []
        for item in items:
            if isinstance(item, dict) and list(item) == ["exit_code"]:
                codes = item["exit_code"] if isinstance(item["exit_code"], list) else [item["exit_code"]]
                _check_codes(codes)
                out.append({"exit_code": codes})
            elif item in ("signal", "hang"):
                out.append(item)
            else:
                raise ValueError(f"{_short(item)} is not a restart trigger — {TRIGGER_HINT}")
        return out

    @property
    def on_signal(self) -> bool:
        return "signal" in self.on

    @property
    def on_hang(self) -> bool:
        return "hang" in self.on

    @property
    def exit_codes(self) -> frozenset[int]:
        return frozenset(c for t in self.on if isinstance(t, ExitCodes) for c in t.exit_code)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_codes(codes: list[Any]) -> None:
    if not codes:
        raise ValueError("exit_code: [] names no code — give codes from 1 to 255")
    for code in codes:
        if isinstance(code, bool) or not isinstance(code, int) or not 1 <= code <= 255:
            raise ValueError(f"exit_code {_short(code)} is no failure exit code — give codes from 1 to 255")
        if code == EXIT_TERMINATED:
            # 128 + SIGTERM: how a program says it was stopped, and a stop is a person's decision.
            raise ValueError(
                f"exit_code {code} means stopped by SIGTERM, which never restarts — leave it out"
                " (`signal` restarts a run killed by another signal)"
            )
