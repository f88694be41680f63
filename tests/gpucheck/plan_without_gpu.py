"""pytest plugin for planning the GPU tests on a machine without one: drops the skip that the
suite's conftest puts on `gpu` tests, so `--setup-plan` resolves every fixture they ask for."""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.own_markers[:] = [m for m in item.own_markers if m.name != "skip"]
