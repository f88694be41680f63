"""SQLite store (sqlite-utils): telemetry samples with rollups, and the runs the daemon supervises.

sqlite-utils is imported here, once, without pandas and numpy: it imports both whenever they are
installed, only to map their column types, and gpuwarden never hands it their values. On a
training machine both are installed, and the import would cost the daemon and the dashboard
their start-up time and resident memory (numpy's BLAS reserves buffers for every core). Other
modules import `sqlite_utils` from here, or after this package.
"""

import sys
from collections.abc import Iterator
from contextlib import contextmanager

_NOT_NEEDED = ("pandas", "numpy")


@contextmanager
def _without_dataframes() -> Iterator[None]:
    # A None entry makes `import name` raise ImportError; it is removed afterwards, so a later,
    # deliberate import of numpy (torch's, in a runner) still works.
    blocked = [name for name in _NOT_NEEDED if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in blocked:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]


with _without_dataframes():
    import sqlite_utils as sqlite_utils
