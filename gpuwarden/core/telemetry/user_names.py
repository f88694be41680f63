"""A uid's login name, as process tables show it."""

from __future__ import annotations

import pwd


class UserNames:
    """uid → name, remembered: getpwuid goes through NSS (files, LDAP …) and a uid's name does not
    change while a reader lives. A uid without an entry reads as its number."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}

    def __call__(self, uid: int) -> str:
        if uid not in self._names:
            try:
                self._names[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                self._names[uid] = str(uid)
        return self._names[uid]
