"""Keys typed while a dialog opens. A fast typist or a paste sends `n` and a spec's path in one
read: without a hold, the letters after `n` reach the main screen before the dialog has focus (`s`
offers to stop a run, `q` quits). The keys are kept from the moment a dialog is asked for and
replayed, in the order typed, once the dialog has focus."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from textual import events
from textual.app import App
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import Widget

from gpuwarden.tui.session_log import LOG

# Keys held for a dialog that never takes focus are let go after this, so no fault can leave the
# keyboard dead; a dialog normally has focus within a frame or two.
HOLD_S = 5.0


class KeyHold:
    """The app's keys while a dialog opens; `replay` hands a key on as if it were read now."""

    def __init__(self, app: App[Any], replay: Callable[[events.Key], Awaitable[None]]) -> None:
        self._app = app
        self._replay = replay
        self._held: list[events.Key] | None = None
        self._under: Screen[Any] | None = None  # the screen on top when the hold began
        self._timer: Timer | None = None

    def start(self) -> None:
        """Keep the keys read from now on for the dialog about to open."""
        if self._held is None:
            self._held = []
            self._under = self._app.screen
            self._timer = self._app.set_timer(HOLD_S, self._expired)

    def take(self, event: events.Event) -> bool:
        """True when `event` is a key kept for the dialog (the app does not handle it now)."""
        if isinstance(event, events.Key) and not event.is_forwarded and self._held is not None:
            self._held.append(event)
            return True
        return False

    async def focused(self, widget: Widget) -> None:
        """A widget took focus: once it is the new dialog's, the keys go to it."""
        if self._held is None:
            return  # (and the app may be closing, with no screen left to ask for)
        top = self._app.screen
        if top is not self._under and widget.screen is top:
            await self._release(replay=True)

    def drop(self) -> None:
        """The dialog will not open (its data could not be read): what was typed for it is dropped
        rather than acting on the screen below."""
        if self._held:
            LOG.info("dropped %d keys typed for a dialog that did not open", len(self._held))
        self._stop()

    async def _expired(self) -> None:
        await self._release(replay=self._app.screen is not self._under)

    def _stop(self) -> list[events.Key]:
        held = self._held or []
        self._held, self._under = None, None
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        return held

    async def _release(self, *, replay: bool) -> None:
        """The held keys, in the order typed, as if read now (so into the dialog's focused input)."""
        held = self._stop()
        for index, key in enumerate(held if replay else []):
            if self._held is not None:  # a key replayed opened another dialog: the rest are for it
                self._held.extend(held[index:])
                return
            await self._replay(key)
