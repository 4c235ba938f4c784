"""Placeholder for `trainmedic up`."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add `up` to the root app."""
