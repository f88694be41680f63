"""What a tune's probes wrote in the program's own folder, outside the output folder each probe
was given.

A probe runs the user's program where it runs (its relative paths must resolve), with the
output_dir role pointed at the probe's own folder. A program that also writes elsewhere in its
folder (`final.pt`, `results.json` beside the script) has each probe write there too, over what
an earlier real run left. gpuwarden cannot stop that without moving the program; it can say it,
naming the files, so the user looks before trusting them.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

MAX_ENTRIES = 10_000  # a folder of more is read only this far: the check stays bounded
SHOWN = 5


@dataclass(frozen=True)
class FolderFiles:
    """The files directly in a folder, by name: (modification time in ns, size)."""

    folder: Path
    files: dict[str, tuple[int, int]]

    @classmethod
    def read(cls, folder: Path) -> FolderFiles:
        files: dict[str, tuple[int, int]] = {}
        try:
            with os.scandir(folder) as entries:
                for entry in itertools.islice(entries, MAX_ENTRIES):
                    try:
                        if entry.is_file(follow_symlinks=False):
                            st = entry.stat(follow_symlinks=False)
                            files[entry.name] = (st.st_mtime_ns, st.st_size)
                    except OSError:
                        continue  # gone meanwhile
        except OSError:
            pass  # a folder that cannot be read says nothing
        return cls(folder, files)

    def written_note(self) -> str | None:
        """The line naming the files written in the folder since it was read; None when none."""
        now = FolderFiles.read(self.folder).files
        changed = sorted(name for name, seen in now.items() if self.files.get(name) != seen)
        if not changed:
            return None
        over = [name for name in changed if name in self.files]
        new = [name for name in changed if name not in self.files]
        said = [f"overwrote {_names(over)}" if over else "", f"left {_names(new)}" if new else ""]
        return (
            f"the probes wrote in {self.folder}, outside the output folder each was given: "
            f"{' and '.join(s for s in said if s)} — have the program write its files under its "
            "output folder (the output_dir role), and check any that an earlier run left there"
        )


def _names(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more
