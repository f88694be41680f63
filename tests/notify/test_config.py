"""`notify:` in the daemon's config: every mistake is one line naming file:line: key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.core.config.settings import NOTIFY_EVENTS, load_settings
from gpuwarden.core.errors import ConfigError, UserError


def _load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> object:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_settings(path, environ=environ or {})


def _problem(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, text)
    (line,) = e.value.problems
    return line.removeprefix(str(tmp_path / "config.yaml"))


def test_defaults_send_nothing_and_name_every_event(tmp_path: Path) -> None:
    notify = _load(tmp_path, "").notify  # type: ignore[attr-defined]
    assert not notify.configured and notify.urls == [] and notify.on_event is None
    assert tuple(notify.events) == NOTIFY_EVENTS


def test_a_full_section_loads(tmp_path: Path) -> None:
    text = (
        "notify:\n  urls: [ntfy://my-topic, 'json://localhost:8080/hook']\n"
        "  on_event: [/usr/local/bin/tell, --loud]\n  events: [failed, hung]\n"
        "  idle_minutes: 30\n  throttle_minutes: 0\n  max_per_run: 3\n  per_minutes: 5\n"
    )
    notify = _load(tmp_path, text).notify  # type: ignore[attr-defined]
    assert notify.configured and notify.on_event == ["/usr/local/bin/tell", "--loud"]
    assert notify.events == ["failed", "hung"] and notify.throttle_minutes == 0


def test_an_unknown_key_suggests_the_right_one(tmp_path: Path) -> None:
    assert (
        _problem(tmp_path, "notify:\n  url: [ntfy://x]\n")
        == ":2: notify.url: unknown key — did you mean 'urls'?"
    )


def test_urls_must_be_a_list_of_apprise_urls(tmp_path: Path) -> None:
    assert (
        _problem(tmp_path, "notify:\n  urls: ntfy://x\n")
        == ":2: notify.urls: must be a valid list (got 'ntfy://x')"
    )
    line = _problem(tmp_path, "notify:\n  urls: [ntfy://x, my-topic]\n")
    assert line.startswith(":2: notify.urls: 'my-topic' is not an apprise URL — write it as SERVICE://…"), (
        line
    )


def test_on_event_must_be_a_command_as_a_list(tmp_path: Path) -> None:
    line = _problem(tmp_path, "notify:\n  on_event: notify-send gpuwarden\n")
    assert line.startswith(":2: notify.on_event: must be a valid list (got 'notify-s…'"), line
    assert ":2: notify.on_event: " in _problem(tmp_path, "notify:\n  on_event: []\n")
    assert "first item must name a program" in _problem(tmp_path, "notify:\n  on_event: ['', x]\n")


def test_minutes_may_not_be_negative(tmp_path: Path) -> None:
    line = _problem(tmp_path, "notify:\n  idle_minutes: -5\n")
    assert line == ":2: notify.idle_minutes: must be greater than or equal to 0 (got -5)", line
    assert ":2: notify.per_minutes:" in _problem(tmp_path, "notify:\n  per_minutes: 0\n")


def test_an_unknown_event_lists_the_known_ones(tmp_path: Path) -> None:
    line = _problem(tmp_path, "notify:\n  events: [failed, crashed]\n")
    assert line.startswith(":2: notify.events[1]: must be 'succeeded', 'failed', "), line
    assert "'hung'" in line


def test_a_list_setting_from_a_variable_is_json(tmp_path: Path) -> None:
    env = {"GPUWARDEN_NOTIFY__URLS": '["ntfy://a", "ntfy://b"]', "GPUWARDEN_NOTIFY__IDLE_MINUTES": "2"}
    notify = _load(tmp_path, "", env).notify  # type: ignore[attr-defined]
    assert notify.urls == ["ntfy://a", "ntfy://b"] and notify.idle_minutes == 2
    with pytest.raises(UserError, match=r"^environment variable GPUWARDEN_NOTIFY__URLS: must be a JSON list"):
        _load(tmp_path, "", {"GPUWARDEN_NOTIFY__URLS": "ntfy://a"})


def test_what_a_hook_gets_is_no_unknown_setting(tmp_path: Path) -> None:
    """A hook that runs `gpuwarden` itself inherits GPUWARDEN_EVENT and its kin."""
    env = {"GPUWARDEN_EVENT": "failed", "GPUWARDEN_RUN": "r1", "GPUWARDEN_HOST": "h", "GPUWARDEN_BODY": "…"}
    assert not _load(tmp_path, "", env).notify.configured  # type: ignore[attr-defined]
