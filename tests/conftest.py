"""Root conftest: loads the shared fixtures (real Temporal, real Slurm lab)."""

pytest_plugins = [
    "tests.fixtures.temporal",
    "tests.fixtures.lab",
    "tests.fixtures.controller",
]
