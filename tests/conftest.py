"""Root conftest: loads the shared fixtures (real Temporal, real Slurm lab)."""

import pytest

pytest_plugins = [
    "tests.fixtures.temporal",
    "tests.fixtures.lab",
    "tests.fixtures.controller",
    "tests.fixtures.ssh",
    "tests.fixtures.pyslurm",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/integration and tests/chaos runs real daemons: mark it
    `integration` whether or not its file says so (two files once forgot)."""
    for item in items:
        parts = item.path.parts
        if "integration" in parts or "chaos" in parts:
            item.add_marker(pytest.mark.integration)
