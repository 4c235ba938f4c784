"""The chaos scenarios' lab: the session's clean lab with node agents' files in place."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trainmedic.lab import Lab
from trainmedic.lab.workload import prepare_nodes, reset_nodes


@pytest.fixture
def lab(clean_lab: Lab) -> Iterator[Lab]:
    prepare_nodes(clean_lab)
    yield clean_lab
    reset_nodes(clean_lab)
